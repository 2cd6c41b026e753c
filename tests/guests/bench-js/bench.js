// `bench-js`: the JavaScript twin of the `bench` guest for the host benchmark's language
// section (`host/benches/factory.rs`). `args.workload` selects `empty` (start-up), `fanout`
// (`n` agents at once) or `small` (3 agents, a step, a log line: many live runs); the result
// is `{ workload, n, done }` as the Rust guest's.
import { defineFactory } from "factory";

export default defineFactory({
    meta: {
        name: "bench-js",
        description: "Host benchmark workloads in JS. args: { workload: string, n?: number }",
        phases: [{ title: "Bench" }],
    },
    run: async (ctx) => {
        const { workload, n = 0 } = ctx.args;
        let done;
        if (workload === "empty") {
            done = 0;
        } else if (workload === "fanout") {
            const replies = await ctx.parallel(
                Array.from({ length: n }, (_, i) => () => ctx.agent(`fan-out task ${i}`, { label: `f:${i}` }))
            );
            done = replies.filter((r) => r !== null).length;
        } else if (workload === "small") {
            ctx.phase("Bench");
            const replies = await ctx.parallel(
                [0, 1, 2].map((i) => () => ctx.agent(`small task ${i}`, { label: `m:${i}` }))
            );
            const ok = replies.filter((r) => r !== null).length;
            done = await ctx.step("count", () => ok);
            ctx.log(`small run: ${done} replies`);
        } else {
            throw new Error(`unknown workload \`${workload}\``);
        }
        return { workload, n, done };
    },
});
