// A test factory: `n` agents in phase "Fan out" (labels `${prefix}${i}`: the test backend's
// rules give `t:` a fast reply, `slow:` a slow one and `hang:` one that never comes in time),
// then `logs` progress lines in phase "Log".
import { defineFactory, joinSession } from "@github/copilot-sdk/extension";

const fanout = defineFactory({
    meta: {
        name: "fanout",
        description: "args: { n?: number, logs?: number, prefix?: string }",
        phases: [{ title: "Fan out" }, { title: "Log" }],
    },
    run: async (ctx) => {
        ctx.phase("Fan out");
        const prefix = ctx.args.prefix ?? "t:";
        const replies = await ctx.parallel(
            Array.from({ length: ctx.args.n ?? 1 }, (_, i) => () => ctx.agent(`item ${i}`, { label: `${prefix}${i}` })),
        );
        ctx.phase("Log");
        for (let i = 0; i < (ctx.args.logs ?? 0); i++) ctx.log(`line ${i}`);
        return { done: replies.filter((r) => r !== null).length };
    },
});

await joinSession({ factories: [fanout] });
