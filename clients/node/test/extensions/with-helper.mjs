// An extension in the spec's form whose `run` uses its module's scope: a constant and a
// helper function defined beside it (the spec lets an extension's factories use their
// module). Only the import line differs from an extension of @github/copilot-sdk.
import { defineFactory, joinSession } from "@factory/client";

const REVIEW = "Review ";

function reviewLabel(file) {
    return `${REVIEW}${file}`;
}

const reviewWithHelper = defineFactory({
    meta: {
        name: "review-with-helper",
        description: "Review files with a helper of the module. args: { files: string[] }",
        phases: [{ title: "Review" }],
    },
    run: async (ctx) => {
        ctx.phase("Review");
        const reviews = await ctx.parallel(
            ctx.args.files.map((file) => () => ctx.agent(reviewLabel(file), { label: reviewLabel(file) }))
        );
        return { labels: ctx.args.files.map(reviewLabel), reviews };
    },
});

const session = await joinSession({ factories: [reviewWithHelper] });
