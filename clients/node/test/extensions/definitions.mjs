// Factories and a workflow the client's tests register: defined in a module of their own
// (imports only the client), as a program keeps the factories it registers, so the service
// can evaluate the module in its sandbox.
import { defineFactory, defineWorkflow } from "@factory/client";

export const echo = defineFactory({
    meta: { name: "node-echo", description: "args: { word: string }", phases: [{ title: "Echo" }] },
    run: async (ctx) => {
        ctx.phase("Echo");
        const reply = await ctx.agent(`echo ${ctx.args.word}`, { label: "t:echo" });
        return { word: ctx.args.word, reply };
    },
});

export const wfEcho = defineWorkflow({
    meta: { name: "node-wf-echo", description: "args: { word: string }" },
    run: async (ctx) => ({ word: ctx.args.word, reply: await ctx.agent(`echo ${ctx.args.word}`, { label: "t:echo" }) }),
});

export const capped = defineFactory({
    meta: { name: "node-capped", description: "args: { n: number }", limits: { maxTotalSubagents: 2 } },
    run: async (ctx) => {
        const replies = await ctx.parallel(Array.from({ length: ctx.args.n }, (_, i) => () => ctx.agent(`item ${i}`, { label: `t:${i}` })));
        return { done: replies.filter((r) => r !== null).length };
    },
});
