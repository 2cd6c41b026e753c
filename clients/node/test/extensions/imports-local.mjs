// An extension in the spec's form whose `run` uses a local module it imports (which imports
// another in turn): the service resolves the imports within this directory.
import { defineFactory, joinSession } from "@factory/client";
import { plan, summarize } from "./lib/plan.mjs";

const planned = defineFactory({
    meta: {
        name: "planned-review",
        description: "Plan the files to review, review them, summarize. args: { files: string[], top?: number }",
        phases: [{ title: "Plan" }, { title: "Review" }],
    },
    run: async (ctx) => {
        ctx.phase("Plan");
        const { chosen, dropped } = plan(ctx.args.files, ctx.args.top);
        if (dropped.length > 0) ctx.log(`dropped ${dropped.length}: ${dropped.join(", ")}`);
        ctx.phase("Review");
        const reviews = await ctx.parallel(chosen.map((file) => () => ctx.agent(`Review ${file}`, { label: `Review ${file}` })));
        return summarize(chosen, reviews);
    },
});

const session = await joinSession({ factories: [planned] });
