"""`multi-stage-review` in Python: the spec's "Multi-stage review" pattern. One reviewer per
dimension (bugs, performance, security) lists findings, and an adversarial verifier checks
each finding; only confirmed findings are returned. The stages form a pipeline, so each
dimension is verified as soon as its own review lands: a slow reviewer never holds up the
others.

    factory run examples/python/multi_stage_review.py --args '{"diff":"..."}'
"""

from dataclasses import dataclass
from typing import Optional, TypedDict

from factory_sdk import Ctx, factory


class Args(TypedDict, total=False):
    #: The diff to review; without it, the repository's uncommitted changes.
    diff: str


@dataclass
class Finding:
    #: One line: what is wrong, and where.
    title: str


@dataclass
class Findings:
    """A reviewer's reply (the spec's FINDINGS schema)."""

    findings: list[Finding]


@dataclass
class Verdict:
    """A verifier's reply (the spec's VERDICT schema)."""

    #: True only if the finding survived the attempt to refute it.
    isReal: bool


DIMENSIONS = [("bugs", "correctness bugs"), ("perf", "performance issues"), ("security", "security vulnerabilities")]

#: Findings verified per dimension; the rest are dropped (and logged). With the schema retry
#: this bounds the run to 3 + 3 x 8 subagents, twice that with retries.
MAX_FINDINGS = 8


@factory(
    name="multi-stage-review-py",
    description="Review a diff along several dimensions (bugs, perf, security) and adversarially "
    "verify every finding; returns the confirmed ones. "
    "args: { diff?: string } — the diff to review (default: the uncommitted changes).",
    phases=[("Review", "one reviewer per dimension, each verified as it lands")],
    max_concurrent_subagents=4,
    max_total_subagents=60,
    timeout_seconds=900,
    args=Args,
)
async def run(ctx: Ctx[Args]) -> dict:
    diff = ctx.args.get("diff")
    changes = (
        f"The changes:\n```diff\n{diff}\n```"
        if diff
        else "The changes are the repository's uncommitted ones (`git diff HEAD`)."
    )

    async def review(dimension: tuple[str, str], _item: object, _index: int) -> Optional[Findings]:
        key, focus = dimension
        return await ctx.agent(
            f"Review the changes for {focus}. Report each distinct issue as one finding whose "
            f"title says what is wrong and where; return an empty list when there is none.\n\n{changes}",
            label=f"review:{key}",
            schema=Findings,
        )

    async def verify(found: Optional[Findings], dimension: tuple[str, str], _index: int) -> list[dict]:
        key, focus = dimension
        if found is None:
            ctx.log(f"review:{key} produced nothing")
            return []
        findings = found.findings
        if not findings:
            ctx.log(f"review:{key} found no {focus}")
            return []
        if len(findings) > MAX_FINDINGS:
            # No silent caps: say what goes unverified.
            dropped = [f.title for f in findings[MAX_FINDINGS:]]
            ctx.log(f"review:{key}: verifying the first {MAX_FINDINGS} findings, dropped {len(dropped)}: {dropped}")
            findings = findings[:MAX_FINDINGS]
        verdicts = await ctx.parallel(
            ctx.agent(
                f'Adversarially verify this {focus} finding: "{f.title}". Try to refute it against '
                f"the code; answer isReal: true only if it holds up, false when unsure.\n\n{changes}",
                label=f"verify:{key}:{i}",
                schema=Verdict,
            )
            for i, f in enumerate(findings)
        )
        # A failed verifier (None) confirms nothing.
        return [{"dimension": key, "title": f.title} for f, v in zip(findings, verdicts) if v is not None and v.isReal]

    ctx.phase("Review")  # Run-global: set it before the fan-out, never inside a stage.
    per_dimension = await ctx.pipeline(DIMENSIONS, review, verify)
    # A dimension whose stage failed is None: it confirmed nothing.
    confirmed = [c for found in per_dimension if found for c in found]
    return {"confirmed": confirmed, "dimensions": len(DIMENSIONS)}
