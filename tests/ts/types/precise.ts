// Type-level checks of guest-sdk/js's declarations, compiled (never run) by tests/js_types.rs
// with the pinned TypeScript: each `Equal` must hold, and each `@ts-expect-error` line must
// BE an error (tsc fails on an unused directive), so loosening a type fails the test.
import { defineFactory, defineWorkflow, joinSession } from "factory";
import type { FactoryContext, FactoryFailure, FactoryRunResult, FromSchema, JsonValue, FactoryAbortError } from "factory";
import * as extension from "@github/copilot-sdk/extension";
import * as sdk from "@github/copilot-sdk";

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function expectType<T extends true>(): T | undefined {
    return undefined;
}

// The three module names are one API.
expectType<Equal<typeof extension.defineFactory, typeof defineFactory>>();
expectType<Equal<typeof sdk.joinSession, typeof joinSession>>();

// Schema inference: honored keywords shape the reply's type.
const VERDICT = { type: "object", properties: { real: { type: "boolean" }, note: { type: "string" } }, required: ["real"] } as const;
expectType<Equal<FromSchema<typeof VERDICT>, { real: boolean; note?: string }>>();
const LEVEL = { type: "string", enum: ["low", "high"] } as const;
expectType<Equal<FromSchema<typeof LEVEL>, "low" | "high">>();
const LIST = { type: "array", items: { anyOf: [{ type: "integer" }, { type: "null" }] } } as const;
expectType<Equal<FromSchema<typeof LIST>, (number | null)[]>>();
expectType<Equal<FromSchema<{ type: "string" | "number" }>, string | number>>();
expectType<Equal<FromSchema<{ const: 7 }>, 7>>();
// A schema whose keywords are not literal types says nothing more than JSON.
expectType<Equal<FromSchema<{ type: string }>, JsonValue>>();

export const checked = defineFactory<{ files: string[] }>({
    meta: {
        name: "precise",
        description: "type checks",
        phases: [{ title: "One", detail: "first" }],
        limits: { maxConcurrentSubagents: 2, maxTotalSubagents: 3, timeoutSeconds: 1.5, maxAiCredits: 1 },
        argsSchema: { type: "object", required: ["files"], additionalProperties: false },
        agentLimits: { maxTurns: 8, maxDurationSeconds: 600, wrapUp: "Give your answer now." },
    },
    run: async (ctx) => {
        expectType<Equal<typeof ctx.args, { files: string[] }>>();
        expectType<Equal<typeof ctx.runId, string>>();
        const text = await ctx.agent("hello", { label: "a", model: "m" });
        expectType<Equal<typeof text, string | null>>();
        const verdict = await ctx.agent("judge", { schema: VERDICT });
        expectType<Equal<typeof verdict, { real: boolean; note?: string } | null>>();
        // An inline schema is inferred without `as const`.
        const inline = await ctx.agent("n", { schema: { type: "object", properties: { n: { type: "number" } }, required: ["n"] } });
        expectType<Equal<typeof inline, { n: number } | null>>();

        // A checkpoint: the resume's answer, typed as the caller says, or null.
        const approval = await ctx.pause<{ approved: boolean }>("approve");
        expectType<Equal<typeof approval, { approved: boolean } | null>>();
        expectType<Equal<Awaited<ReturnType<typeof ctx.pause>>, JsonValue | null>>();
        // @ts-expect-error the key is a string
        await ctx.pause(1);

        // @ts-expect-error the prompt is a string
        await ctx.agent(123);
        // @ts-expect-error options are exactly label, schema, model and the soft limits
        await ctx.agent("x", { labels: "typo" });
        // Per-agent soft limits, with a schema or without.
        const bounded = await ctx.agent("x", { label: "b", maxTurns: 3, maxDurationSeconds: 1.5, wrapUp: "Finish now." });
        expectType<Equal<typeof bounded, string | null>>();
        // @ts-expect-error maxTurns is a number
        await ctx.agent("x", { maxTurns: "3" });
        // @ts-expect-error a schema type the host does not know
        await ctx.agent("x", { schema: { type: "strin" } });

        const all = await ctx.parallel(ctx.args.files.map((f) => () => ctx.agent(`Review ${f}`)));
        expectType<Equal<typeof all, (string | null)[]>>();
        const pair = await ctx.parallel([() => 1, async () => "two"]);
        expectType<Equal<typeof pair, [number | null, string | null]>>();
        // @ts-expect-error parallel takes thunks, not promises
        await ctx.parallel([ctx.agent("x")]);

        const staged = await ctx.pipeline(
            ctx.args.files,
            (file, item, index) => {
                expectType<Equal<typeof file, string>>();
                expectType<Equal<typeof index, number>>();
                return ctx.agent(`Review ${item}`, { schema: VERDICT });
            },
            (review) => (review ? review.real : false),
        );
        expectType<Equal<typeof staged, (boolean | null)[]>>();

        const kept = await ctx.step("k", () => ({ n: 1, list: ["a"] }));
        expectType<Equal<typeof kept, { n: number; list: string[] }>>();
        // @ts-expect-error a journaled step value must be JSON
        await ctx.step("f", () => () => 1);
        // @ts-expect-error undefined is not JSON
        await ctx.step("u", () => undefined);
        const live = await ctx.step("m", () => new Map<string, number>(), { volatile: true });
        expectType<Equal<typeof live, Map<string, number>>>();
        // @ts-expect-error the key is a string
        await ctx.step(1, () => 1);

        ctx.phase("One");
        ctx.log(`run ${ctx.runId}`);
        // @ts-expect-error log takes a string
        ctx.log({ n: 1 });
        await ctx.sleep(10);
        expectType<Equal<typeof ctx.signal.aborted, boolean>>();
        ctx.signal.addEventListener("abort", () => console.warn("aborted", ctx.signal.reason));
        expectType<Equal<typeof ctx.session.runId, string | undefined>>();
        expectType<Equal<ReturnType<typeof ctx.session.workflow.run>, Promise<never>>>();
        expectType<Equal<ReturnType<typeof ctx.factory>, Promise<never>>>();
        expectType<Equal<ReturnType<typeof ctx.workflow>, Promise<never>>>();
        await ctx.agent("tuned", { label: "t", agent: "reviewer", reasoningEffort: "high", contextTier: "long_context" });
        // @ts-expect-error not a reasoning effort
        await ctx.agent("tuned", { reasoningEffort: "max" });

        try {
            await ctx.agent("x");
        } catch (e) {
            const abort = e as FactoryAbortError;
            // @ts-expect-error not an abort kind
            if (abort.kind === "limit_reached") return null;
        }

        const timer = setTimeout(() => undefined, 5);
        clearTimeout(timer);
        const bytes = new TextEncoder().encode("é");
        expectType<Equal<typeof bytes, Uint8Array>>();
        const url = new URL("https://example.com/a?b=1");
        expectType<Equal<ReturnType<typeof url.searchParams.get>, string | null>>();
        const controller = new AbortController();
        AbortSignal.any([controller.signal, AbortSignal.timeout(5)]);
        structuredClone({ a: 1 });
        btoa(atob("YQ=="));
        // @ts-expect-error no fetch in the runner
        await fetch("https://example.com");
        // @ts-expect-error no Node built-ins in the runner
        process.exit(1);
        // @ts-expect-error no DOM in the runner
        document.title;

        return { reviewed: all.length, staged };
    },
});

defineFactory({
    // @ts-expect-error a limit the host does not know
    meta: { name: "x", description: "", limits: { maxAgents: 3 } },
    run: () => undefined,
});
defineFactory({
    meta: { name: "x", description: "" },
    // @ts-expect-error the result must be JSON or nothing
    run: async () => new Date(),
});
// @ts-expect-error meta.description is required
defineFactory({ meta: { name: "x" }, run: () => null });

await joinSession({ factories: [checked] });
// Upstream's current name: the same definition and handle.
const workflow = defineWorkflow({ meta: { name: "wf", description: "" }, run: async () => 1 });
await joinSession({ workflows: [workflow] });
// @ts-expect-error joinSession takes defineFactory results only
await joinSession({ factories: [{ meta: { name: "x", description: "" }, run: () => null }] });

// A factory typed by annotating its context.
defineFactory({
    meta: { name: "annotated", description: "" },
    run: async ({ args }: FactoryContext<{ n: number }>) => args.n + 1,
});

// The envelope: statuses and failure kinds are the host's exact strings.
declare const run: FactoryRunResult<{ reviewed: number }>;
if (run.status === "completed" && run.result) expectType<Equal<typeof run.result.reviewed, number>>();
const failure = run.failure;
if (failure?.type === "factory_limit_reached") {
    expectType<Equal<typeof failure.kind, "maxTotalSubagents" | "timeoutSeconds" | "maxAiCredits">>();
}
const limit: FactoryFailure = { type: "factory_limit_reached", kind: "maxAiCredits", message: "over budget" };
const outage: FactoryFailure = { type: "backend", kind: "rate_limited", message: "429" };
// @ts-expect-error not a factory limit
const wrongKind: FactoryFailure = { type: "factory_limit_reached", kind: "maxAgents", message: "" };
// @ts-expect-error not a failure type
const wrongType: FactoryFailure = { type: "limit_reached", kind: "maxAiCredits", message: "" };
// @ts-expect-error not a backend failure kind
const wrongOutage: FactoryFailure = { type: "backend", kind: "offline", message: "" };
if (failure?.type === "paused") expectType<Equal<typeof failure.kind, "caller" | "checkpoint">>();
expectType<Equal<typeof run.checkpoint, string | undefined>>();
// @ts-expect-error not a run status
const wrongStatus: FactoryRunResult["status"] = "failed";
export { limit, outage, wrongKind, wrongType, wrongOutage, wrongStatus };
