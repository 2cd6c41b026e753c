"""`review-changed` in Python: one subagent reviews each changed file, all of them at once;
the reviews are then journaled as one report, so a resumed run returns the same report
without asking anyone again.

    factory run examples/python/review_changed.py --args '{"files":["src/a.rs"]}'
"""

from dataclasses import dataclass, field

from factory_sdk import Ctx, factory


@dataclass
class Args:
    #: The paths to review (one subagent each).
    files: list[str] = field(default_factory=lambda: ["src/lib.rs", "src/main.rs", "README.md"])


@factory(
    name="review-changed-py",
    description="Review changed files and verify the findings. args: { files: string[] } — "
    "the paths to review (one subagent each; defaults to src/lib.rs, src/main.rs and README.md).",
    phases=["Review", "Verify"],
    max_concurrent_subagents=3,
    max_total_subagents=10,  # one spawn per file (text calls never retry)
    timeout_seconds=90.5,
    args=Args,
)
async def run(ctx: Ctx[Args]) -> dict:
    files = ctx.args.files

    ctx.phase("Review")
    # Each file gets its own label, so two reviews never memoize into one subagent.
    reviews = await ctx.parallel(
        ctx.agent(
            f"Review {file}: point out bugs, risky changes and unclear code, most important "
            'first. Reply with a short list, or "no findings".',
            label=f"review:{file}",
        )
        for file in files
    )

    ctx.phase("Verify")
    # `None` (the reviewer failed) is kept, so every file shows up in the report.
    return await ctx.step(
        "report",
        lambda: {"reviews": [{"file": f, "review": r} for f, r in zip(files, reviews)]},
    )
