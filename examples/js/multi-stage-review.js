// Multi-stage review (the spec's pattern): each dimension reviews with a schema, then each
// of its findings is verified by adversarial skeptics as soon as that review lands (a
// pipeline: no barrier between a slow dimension and a fast one).
//
//   factory run examples/js/multi-stage-review.js --args '{"diff":"..."}'
// @ts-check
import { defineFactory } from "factory";

export default defineFactory({
    meta: {
        name: "multi-stage-review",
        description:
            "Review a diff along several dimensions and keep the findings a majority of skeptics " +
            "fails to refute. args: { diff?: string, skeptics?: number }",
        phases: [{ title: "Review" }, { title: "Summarize" }],
        limits: { maxConcurrentSubagents: 8, maxTotalSubagents: 200 },
    },
    /** @param {import("factory").FactoryContext<{ diff?: string, skeptics?: number }>} ctx */
    run: async ({ args, pipeline, parallel, agent, phase, log, step }) => {
        // `@type {const}` keeps the schemas' literal types: replies are typed from them.
        const FINDINGS = /** @type {const} */ ({
            type: "object",
            properties: {
                findings: {
                    type: "array",
                    items: { type: "object", properties: { title: { type: "string" } }, required: ["title"] },
                },
            },
            required: ["findings"],
        });
        const VERDICT = /** @type {const} */ ({ type: "object", properties: { isReal: { type: "boolean" } }, required: ["isReal"] });
        const DIMENSIONS = [
            { key: "bugs", prompt: "Review the diff for correctness bugs. Return JSON {findings:[{title}]}." },
            { key: "perf", prompt: "Review the diff for performance issues. Return JSON {findings:[{title}]}." },
            { key: "security", prompt: "Review the diff for security issues. Return JSON {findings:[{title}]}." },
        ];
        const diff = typeof args.diff === "string" ? args.diff : "(no diff given)";
        const skeptics = typeof args.skeptics === "number" && Number.isInteger(args.skeptics) && args.skeptics > 0 ? args.skeptics : 3;

        phase("Review"); // Run-global: set it before the fan-out, never inside a stage.
        const perDimension = await pipeline(
            DIMENSIONS,
            (d) => agent(`${d.prompt}\n\n${diff}`, { label: `review:${d.key}`, schema: FINDINGS }),
            (review, d) => {
                if (!review) {
                    log(`review:${d.key} produced nothing`);
                    return [];
                }
                return parallel(
                    review.findings.map((f, i) => async () => {
                        // Adversarial verify: each skeptic tries to refute; default to refuted.
                        const votes = await parallel(
                            Array.from({ length: skeptics }, (_, s) => () =>
                                agent(
                                    `Try to refute this finding; answer isReal=false when unsure.\nFinding: ${f.title}\n\n${diff}`,
                                    { label: `verify:${d.key}:${i}:${s}`, schema: VERDICT }
                                )
                            )
                        );
                        const real = votes.filter((v) => v !== null && v.isReal === true).length;
                        return real * 2 > skeptics ? { dimension: d.key, ...f, votes: real } : null;
                    })
                );
            }
        );

        phase("Summarize");
        const confirmed = perDimension.flat().filter((v) => v !== null);
        return step("summary-v1", () => ({ confirmed, dimensions: DIMENSIONS.length, skeptics }));
    },
});
