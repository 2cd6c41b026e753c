// The spec's "Define and register a factory" (docs/factories.md of @github/copilot-sdk),
// verbatim but for its import line: `@github/copilot-sdk/extension` is this package here.
// spec-snippets.test.mjs imports it as an extension would be loaded.
import { defineFactory, joinSession } from "@factory/client";

const reviewChanged = defineFactory({
    meta: {
        name: "review-changed",
        description:
            "Review changed files and verify the findings. " +
            "args: { files: string[] } — the paths to review.",
        phases: [{ title: "Review" }, { title: "Verify" }],
        limits: {
            maxConcurrentSubagents: 3,
            maxTotalSubagents: 10,
            timeoutSeconds: 90.5,
            maxAiCredits: 5,
        },
    },
    run: async (ctx) => {
        ctx.phase("Review");
        const reviews = await ctx.parallel(
            ctx.args.files.map(
                (file) => () => ctx.agent(`Review ${file}`, { label: `Review ${file}` })
            )
        );

        ctx.phase("Verify");
        const report = await ctx.step("report", () => ({ reviews }));
        ctx.log(`Completed factory run ${ctx.runId}`);
        return report;
    },
});

const session = await joinSession({ factories: [reviewChanged] });
