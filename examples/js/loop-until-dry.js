// Loop until dry (the spec's pattern): spawn finders round after round until two
// consecutive rounds surface nothing new, dedupe against everything seen, and judge each
// fresh finding through three lenses.
//
//   factory run examples/js/loop-until-dry.js --args '{"maxRounds":5}'
// @ts-check
import { defineFactory } from "@github/copilot-sdk/extension";

export default defineFactory({
    meta: {
        name: "loop-until-dry",
        description: "Find bugs until two rounds in a row find nothing new. args: { maxRounds?: number }",
        phases: [{ title: "Find" }],
        limits: { maxConcurrentSubagents: 6, maxTotalSubagents: 400 },
    },
    /** @param {import("@github/copilot-sdk/extension").FactoryContext<{ maxRounds?: number }>} ctx */
    run: async ({ args, parallel, agent, phase, log }) => {
        // `@type {const}` keeps the schemas' literal types: replies are typed from them.
        const BUGS = /** @type {const} */ ({
            type: "object",
            properties: {
                bugs: {
                    type: "array",
                    items: { type: "object", properties: { title: { type: "string" } }, required: ["title"] },
                },
            },
            required: ["bugs"],
        });
        const VERDICT = /** @type {const} */ ({ type: "object", properties: { real: { type: "boolean" } }, required: ["real"] });
        const maxRounds = typeof args.maxRounds === "number" && Number.isInteger(args.maxRounds) && args.maxRounds > 0 ? args.maxRounds : 20;

        const seen = new Set();
        const confirmed = [];
        const keyOf = (/** @type {{ title: string }} */ b) => b.title.toLowerCase();
        let dry = 0;
        let round = 0;

        phase("Find");
        while (dry < 2 && round < maxRounds) {
            const found = (
                await parallel(
                    [0, 1, 2].map((i) => () =>
                        agent(`Find bugs (finder ${i}, round ${round}). Return JSON {bugs:[{title}]}.`, {
                            label: `find:${round}:${i}`,
                            schema: BUGS,
                        })
                    )
                )
            )
                .filter((v) => v !== null)
                .flatMap((r) => r.bugs);

            const fresh = found.filter((b) => {
                const k = keyOf(b);
                if (seen.has(k)) return false;
                seen.add(k);
                return true;
            });
            log(`round ${round}: ${found.length} found, ${fresh.length} new`);
            round++;
            if (!fresh.length) {
                dry++;
                continue;
            }
            dry = 0;

            const judged = await parallel(
                fresh.map((b, i) => () =>
                    parallel(
                        ["correctness", "security", "repro"].map((lens) => () =>
                            agent(`Judge via ${lens}: is "${b.title}" real? Return JSON {real}.`, {
                                label: `judge:${round}:${i}:${lens}`,
                                schema: VERDICT,
                            })
                        )
                    ).then((vs) => ({ b, real: vs.filter((v) => v !== null && v.real).length >= 2 }))
                )
            );
            confirmed.push(...judged.flatMap((v) => (v !== null && v.real ? [v.b] : [])));
        }
        if (round === maxRounds && dry < 2) log(`stopped after ${maxRounds} rounds without running dry`);
        return { confirmed, rounds: round };
    },
});
