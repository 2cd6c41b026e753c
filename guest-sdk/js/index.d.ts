// Types of the factory runtime that `factory`'s JS runner provides to a factory module, under
// the module names `"factory"`, `"@github/copilot-sdk/extension"` and `"@github/copilot-sdk"`
// (guest-sdk/js-runner/src/prelude.js and globals.js are the implementation; README
// "Writing a factory (JavaScript)" the behaviour). The run envelope types at the end
// describe what `factory run --json`, the HTTP API and the Node client return for a run.
//
// The runner's global scope (console, timers, AbortController, ...) is declared in
// globals.d.ts, referenced below; type-check factories with `"lib": ["ES2022"]` and no DOM.

/// <reference path="./globals.d.ts" />

// ---------------------------------------------------------------------------------------
// JSON

/** A JSON scalar. */
export type JsonPrimitive = string | number | boolean | null;
/** A JSON array (read-only: a value the host hands over is a fresh copy either way). */
export type JsonArray = readonly JsonValue[];
/** A JSON object: plain keys to JSON values (no `undefined`, functions, `Map`s, `Date`s). */
export type JsonObject = { readonly [key: string]: JsonValue };
/** What crosses the host boundary: arguments, step values, schema replies, results. */
export type JsonValue = JsonPrimitive | JsonArray | JsonObject;

// ---------------------------------------------------------------------------------------
// Schemas

/** The JSON Schema type names the host's schema check knows. */
export type JsonSchemaTypeName = "object" | "array" | "string" | "number" | "integer" | "boolean" | "null";

/**
 * A JSON Schema as `ctx.agent` and `meta.argsSchema` take it: a structural subset. Honored
 * (and enforced on every reply): `type`, `required`, `enum`, `const`, recursive
 * `properties`/`items`, `anyOf`/`oneOf` (as anyOf)/`allOf`. Any other keyword
 * (`additionalProperties`, `pattern`, `minLength`, `format`, ranges, ...) is accepted and
 * ignored: do not rely on it.
 */
export type JsonSchema = {
    readonly type?: JsonSchemaTypeName | readonly JsonSchemaTypeName[];
    readonly properties?: { readonly [name: string]: JsonSchema };
    readonly required?: readonly string[];
    readonly items?: JsonSchema;
    readonly enum?: readonly JsonValue[];
    readonly const?: JsonValue;
    readonly anyOf?: readonly JsonSchema[];
    readonly oneOf?: readonly JsonSchema[];
    readonly allOf?: readonly JsonSchema[];
    /** An ignored keyword (`additionalProperties`, `description`, ...): any JSON. */
    readonly [keyword: string]: JsonValue | JsonSchema | readonly JsonSchema[] | undefined;
};

type Simplify<T> = { [K in keyof T]: T[K] } & {};
type UnionOf<B> = B extends readonly [infer H, ...infer R] ? FromSchema<H> | UnionOf<R> : B extends readonly (infer E)[] ? FromSchema<E> : never;
type IntersectionOf<B> = B extends readonly [infer H, ...infer R] ? FromSchema<H> & IntersectionOf<R> : unknown;
type RequiredNames<S> = S extends { readonly required: readonly (infer R)[] } ? Extract<R, string> : never;
type FromObject<S> = S extends { readonly properties: infer P }
    ? Simplify<
          { -readonly [K in keyof P & RequiredNames<S>]: FromSchema<P[K]> } & {
              -readonly [K in Exclude<keyof P, RequiredNames<S>>]?: FromSchema<P[K]>;
          } & { -readonly [K in Exclude<RequiredNames<S>, keyof P>]: JsonValue }
      >
    : { [key: string]: JsonValue };
type FromTypeName<T, S> = string extends T
    ? JsonValue
    : T extends "string"
      ? string
      : T extends "number" | "integer"
        ? number
        : T extends "boolean"
          ? boolean
          : T extends "null"
            ? null
            : T extends "array"
              ? S extends { readonly items: infer I }
                  ? FromSchema<I>[]
                  : JsonValue[]
              : T extends "object"
                ? FromObject<S>
                : never;

/**
 * The type of a value that passed the host's check against schema `S` (declare the schema
 * `as const`, or in JavaScript `/** @type {const} *\/ ({ ... })`, so its literal types are
 * kept). A schema whose keywords are not literal types gives {@link JsonValue}.
 *
 * @example
 * const VERDICT = { type: "object", properties: { real: { type: "boolean" } }, required: ["real"] } as const;
 * type Verdict = FromSchema<typeof VERDICT>; // { real: boolean }
 */
export type FromSchema<S> = S extends { readonly const: infer C }
    ? C
    : S extends { readonly enum: readonly (infer E)[] }
      ? E
      : S extends { readonly anyOf: infer B }
        ? UnionOf<B>
        : S extends { readonly oneOf: infer B }
          ? UnionOf<B>
          : S extends { readonly allOf: infer B }
            ? Simplify<IntersectionOf<B>>
            : S extends { readonly type: infer T }
              ? T extends readonly (infer U)[]
                  ? FromTypeName<U, S>
                  : FromTypeName<T, S>
              : JsonValue;

// ---------------------------------------------------------------------------------------
// Meta and limits

/** A declared progress phase. */
export interface FactoryPhase {
    readonly title: string;
    readonly detail?: string;
}

/**
 * Resource limits, declared in `meta.limits` and overridable per run; each must be positive
 * when present.
 */
export interface FactoryLimits {
    /** Positive integer: subagents running at once (the rest queue; never a failure). */
    readonly maxConcurrentSubagents?: number;
    /** Positive integer: subagents admitted over the run (failure kind `maxTotalSubagents`). */
    readonly maxTotalSubagents?: number;
    /** Positive seconds of accumulated active time, at most 2_147_483.647 (kind `timeoutSeconds`). */
    readonly timeoutSeconds?: number;
    /** Positive AI-credit budget of the run's subagents (kind `maxAiCredits`). */
    readonly maxAiCredits?: number;
}

/** A factory's metadata. */
export interface FactoryMeta {
    /** Stable name: letters, digits, `-`, `_`, `.` (at most 128). */
    readonly name: string;
    /** What it does, and the shape of `args` it reads: the only thing an agent sees. */
    readonly description: string;
    readonly phases?: readonly FactoryPhase[];
    readonly limits?: FactoryLimits;
    /** When present, the host checks every run's args against it before the run exists. */
    readonly argsSchema?: JsonSchema;
    /** Default soft limits of every `ctx.agent` call (a call's own options win, key by key). */
    readonly agentLimits?: AgentSoftLimits;
}

/**
 * Per-agent soft limits: reaching one ends that call (with what the subagent answered by
 * then, else `null`), never the run; the run's detail says which one ended it. They are part
 * of the call's identity (memo key). Backends honour what applies to them: an agent CLI
 * passes `maxTurns` with its turn flag (one without a flag refuses it) and sends `wrapUp`
 * when `maxDurationSeconds` is up if it takes one; an HTTP backend ends its request.
 */
export interface AgentSoftLimits {
    /** Positive integer: model turns the subagent may take. */
    readonly maxTurns?: number | null;
    /** Positive seconds of wall time for the call, at most 2_147_483.647. */
    readonly maxDurationSeconds?: number | null;
    /** The prompt that asks the subagent to finish when `maxDurationSeconds` is up. */
    readonly wrapUp?: string | null;
}

/** How a `ctx.agent` call asks to be run (part of its identity, like `label`). */
export interface AgentTuning {
    /** The agent (persona) to run as, where the backend has one (an agent CLI's `--agent`). */
    readonly agent?: string | null;
    /** OpenAI's `reasoning_effort`; Anthropic's extended-thinking budget; ignored elsewhere. */
    readonly reasoningEffort?: "none" | "minimal" | "low" | "medium" | "high" | "xhigh" | null;
    /** The context-window tier asked for: accepted and keyed, mapped by no backend today. */
    readonly contextTier?: string | null;
}

// ---------------------------------------------------------------------------------------
// The run context

/** Options of a `ctx.agent` call that replies with text. */
export interface AgentTextOptions extends AgentSoftLimits, AgentTuning {
    /** Distinguishes otherwise identical calls (they memoize into one subagent). */
    readonly label?: string | null;
    /** A model name, resolved by the host's backend configuration. */
    readonly model?: string | null;
    readonly schema?: null;
}

/** Options of a `ctx.agent` call whose reply must match `schema`. */
export interface AgentSchemaOptions<S extends JsonSchema = JsonSchema> extends AgentSoftLimits, AgentTuning {
    /** Distinguishes otherwise identical calls (they memoize into one subagent). */
    readonly label?: string | null;
    /** A model name, resolved by the host's backend configuration. */
    readonly model?: string | null;
    /** The reply is parsed JSON checked against it (one retry on a mismatch; both count). */
    readonly schema: S;
}

/** Options of a `ctx.agent` call: exactly `label`, `schema`, `model`, the tuning and the soft
 * limits (any other key is refused with a `TypeError`). */
export type AgentOptions = AgentTextOptions | AgentSchemaOptions;

/** Options of `ctx.step`. */
export interface StepOptions {
    /** Bypass the journal: run the producer every time (its value need not be JSON). */
    readonly volatile?: boolean;
}

/** One `ctx.pipeline` stage: called as `(previous, item, index)`; the first gets `previous = item`. */
export type PipelineStage<P, I, R> = (previous: P, item: I, index: number) => R;

/** The abort kinds an `AbortError` from the host carries in `kind`: the envelope's
 * `failure.type` the run ends with. */
export type FactoryAbortKind =
    /** The run was cancelled (`ctx.signal` is aborted too). */
    | "cancelled"
    /** The host is shutting down: the run ends `halted`, resumable. */
    | "halted"
    /** The run is pausing (a caller paused it, or `ctx.pause(key)` reached a new checkpoint):
     * it ends `paused`, resumable under the same id. */
    | "paused"
    /** A factory limit was reached; `limit` names it. */
    | "factory_limit_reached"
    /** A host sandbox limit (prompt size, step size, ...) was exceeded. */
    | "sandbox_limit"
    /** The durable store failed: nothing may be assumed journaled. */
    | "storage"
    /** The call itself was malformed (an invalid schema, ...): a bug in the factory. */
    | "invalid_call"
    /** The backend could not be used (an outage, not a cancellation). */
    | "backend";

/**
 * What `ctx.agent`, `ctx.step` and friends reject with when the run itself must stop: a
 * `DOMException` named `AbortError`. `ctx.parallel` and `ctx.pipeline` pass it through
 * instead of turning it into `null`; whatever the script does with it, the host records the
 * real cause in the envelope.
 */
export interface FactoryAbortError extends Error {
    readonly name: "AbortError";
    readonly kind: FactoryAbortKind;
    /** For `factory_limit_reached`: which limit (`failure.kind`). */
    readonly limit?: "maxTotalSubagents" | "timeoutSeconds" | "maxAiCredits";
}

/** The `{ -readonly [K in keyof T]: ... }` result of `ctx.parallel(thunks)`. */
export type ParallelResults<T extends readonly (() => unknown)[]> = {
    -readonly [K in keyof T]: T[K] extends () => infer R ? Awaited<R> | null : never;
};

/** `ctx.session.factory` (and `.workflow`): starting, resuming or pausing a run rejects while
 * a body runs ("... are not allowed while a factory body is running on this call path."); the
 * sandbox reaches no session, so the reads reject too, naming `factory show`/`factory runs`. */
export interface FactoryContextSessionApi {
    run(...args: readonly unknown[]): Promise<never>;
    resume(...args: readonly unknown[]): Promise<never>;
    pause(...args: readonly unknown[]): Promise<never>;
    getRun(runId: string): Promise<never>;
    listRuns(...args: readonly unknown[]): Promise<never>;
    getRunDetail(runId: string): Promise<never>;
    getRunProgress(...args: readonly unknown[]): Promise<never>;
    waitForRun(...args: readonly unknown[]): Promise<never>;
    cancel(runId: string): Promise<never>;
}

/** The session a factory sees as `ctx.session` (frozen). */
export interface FactoryContextSession {
    /** The factories `joinSession` registered in this module. */
    readonly factories: readonly AnyFactory[];
    /** The run whose body this is (undefined on the session `joinSession` resolves to). */
    readonly runId: string | undefined;
    readonly factory: FactoryContextSessionApi;
    readonly workflow: FactoryContextSessionApi;
}

/** The `ctx` a factory's `run` receives (destructurable: no member depends on `this`). */
export interface FactoryContext<TArgs = JsonValue> {
    /** Stable across resumed attempts. */
    readonly runId: string;
    /** The run's arguments, verbatim (`{}` when the caller gave none). */
    readonly args: TArgs;
    /**
     * Run one subagent and await its final text; `null` on an ordinary failure (it errored
     * or replied nothing): guard every result. Identical calls (prompt and options) share one
     * subagent: give independent ones a unique `label`.
     */
    agent(prompt: string, options?: AgentTextOptions): Promise<string | null>;
    /**
     * Run one subagent whose reply must be JSON matching `options.schema`; resolves to the
     * parsed value, or `null` when it still fails to parse or match after one retry.
     */
    agent<const S extends JsonSchema>(prompt: string, options: AgentSchemaOptions<S>): Promise<FromSchema<S> | null>;
    /**
     * Run thunks concurrently and await them all (a barrier). A thunk that throws becomes
     * `null`; an abort rejects the whole call. At most 4096 thunks (else a `RangeError`).
     */
    parallel<const T extends readonly (() => unknown)[]>(thunks: T): Promise<ParallelResults<T>>;
    /**
     * Flow each item through every stage, with no barrier between stages. A stage that
     * throws makes its item `null` and skips its later stages; an abort rejects the whole
     * call. At most 4096 items.
     */
    pipeline<I>(items: readonly I[]): Promise<I[]>;
    pipeline<I, R1>(items: readonly I[], s1: PipelineStage<I, I, R1>): Promise<(Awaited<R1> | null)[]>;
    pipeline<I, R1, R2>(
        items: readonly I[],
        s1: PipelineStage<I, I, R1>,
        s2: PipelineStage<Awaited<R1>, I, R2>,
    ): Promise<(Awaited<R2> | null)[]>;
    pipeline<I, R1, R2, R3>(
        items: readonly I[],
        s1: PipelineStage<I, I, R1>,
        s2: PipelineStage<Awaited<R1>, I, R2>,
        s3: PipelineStage<Awaited<R2>, I, R3>,
    ): Promise<(Awaited<R3> | null)[]>;
    pipeline<I, R1, R2, R3, R4>(
        items: readonly I[],
        s1: PipelineStage<I, I, R1>,
        s2: PipelineStage<Awaited<R1>, I, R2>,
        s3: PipelineStage<Awaited<R2>, I, R3>,
        s4: PipelineStage<Awaited<R3>, I, R4>,
    ): Promise<(Awaited<R4> | null)[]>;
    pipeline<I, R1, R2, R3, R4, R5>(
        items: readonly I[],
        s1: PipelineStage<I, I, R1>,
        s2: PipelineStage<Awaited<R1>, I, R2>,
        s3: PipelineStage<Awaited<R2>, I, R3>,
        s4: PipelineStage<Awaited<R3>, I, R4>,
        s5: PipelineStage<Awaited<R4>, I, R5>,
    ): Promise<(Awaited<R5> | null)[]>;
    /** More than five stages: each stage's `previous` is `unknown` (narrow it yourself). */
    pipeline<I>(items: readonly I[], ...stages: PipelineStage<unknown, I, unknown>[]): Promise<unknown[]>;
    /**
     * Journal the producer's JSON value under `key` (the sole identity: version the key when
     * its meaning changes); a resume replays it without running the producer.
     */
    step<T extends JsonValue>(key: string, producer: () => T | PromiseLike<T>, options?: StepOptions & { readonly volatile?: false }): Promise<T>;
    /** A volatile step: the producer runs every time, nothing is journaled. */
    step<T>(key: string, producer: () => T | PromiseLike<T>, options: StepOptions & { readonly volatile: true }): Promise<T>;
    /** Start a named progress phase (run-global: call it between fan-outs, not inside them). */
    phase(title: string): void;
    /** Append one line to the run's progress log. */
    log(message: string): void;
    /** Sleep on the host's clock; counts as active time (`timeoutSeconds`). */
    sleep(ms: number): Promise<void>;
    /**
     * A durable one-shot checkpoint named `key`. The first attempt that reaches it pauses the
     * run there (it rejects with an `AbortError` of kind `paused`; let it propagate) and the
     * run ends `paused`, waiting at `key`. Once resumed (`factory resume RUN --input JSON`),
     * the body runs again from the top (journaled steps and agents replay) and this resolves
     * to the resume's input (`null` without one); every later attempt gets the same answer.
     * Main flow only: refused (a `TypeError`) while a `ctx.parallel`/`ctx.pipeline` is in flight.
     */
    pause<T extends JsonValue = JsonValue>(key: string): Promise<T | null>;
    /** Aborted (with an `AbortError` reason) once the run is cancelled, paused or stopped by a limit. */
    readonly signal: AbortSignal;
    /** The session: refuses to run, resume or pause runs while a body runs. */
    readonly session: FactoryContextSession;
    /** Always rejects: nested factories are not supported. */
    factory(...args: readonly unknown[]): Promise<never>;
    /** Always rejects: nested workflows are not supported. */
    workflow(...args: readonly unknown[]): Promise<never>;
}

// ---------------------------------------------------------------------------------------
// Defining factories

/** What a factory's `run` may resolve to: plain JSON (no getters, hidden properties, extra
 * keys on arrays, holes or class instances: refused with failure type `invalid_result`), or
 * nothing (completed with no result). */
export type FactoryResult = JsonValue | void | undefined;

/** What `defineFactory` takes. */
export interface FactoryDefinition<TArgs = JsonValue, TResult extends FactoryResult = FactoryResult> {
    readonly meta: FactoryMeta;
    readonly run: (ctx: FactoryContext<TArgs>) => Promise<TResult> | TResult;
}

declare const factoryBrand: unique symbol;

/** Any factory handle, whatever its argument and result types. */
export type AnyFactory = Factory<never, FactoryResult>;

/** A factory handle: what `defineFactory` returns (export it, or pass it to `joinSession`);
 * frozen, its `meta` a deep-frozen copy of the definition's. */
export interface Factory<TArgs = JsonValue, TResult extends FactoryResult = FactoryResult> extends FactoryDefinition<TArgs, TResult> {
    readonly [factoryBrand]: true;
}

/**
 * Define a factory. Type the arguments with `defineFactory<Args>(...)` (or by annotating
 * `run`'s parameter as `FactoryContext<Args>`): `args` is forwarded verbatim and checked only
 * against `meta.argsSchema`, so validate what the types claim if there is no schema.
 */
export function defineFactory<TArgs = JsonValue, TResult extends FactoryResult = FactoryResult>(
    definition: FactoryDefinition<TArgs, TResult>,
): Factory<TArgs, TResult>;

/** `defineFactory` under upstream's current name (Dynamic Workflows): the same definition. */
export function defineWorkflow<TArgs = JsonValue, TResult extends FactoryResult = FactoryResult>(
    definition: FactoryDefinition<TArgs, TResult>,
): Factory<TArgs, TResult>;

/** The options of `joinSession`: `factories` or `workflows`, not both; names unique. */
export interface JoinSessionOptions {
    /** The factories this module offers (each a `defineFactory` result). */
    readonly factories?: readonly AnyFactory[];
    /** The workflows this module offers (each a `defineWorkflow` result). */
    readonly workflows?: readonly AnyFactory[];
}

/** The session `joinSession` resolves to inside the factory host: `ctx.session`'s shape (its
 * `factories` are every factory registered by `joinSession` calls so far; run factories with
 * `factory run`). */
export type FactorySession = FactoryContextSession;

/** Register the module's factories (the Copilot SDK's extension entry point). */
export function joinSession(options?: JoinSessionOptions): Promise<FactorySession>;

// ---------------------------------------------------------------------------------------
// The run envelope (`factory run --json`, the HTTP API, the Node client)

/** Where a run is: only `completed` is final; the other terminal statuses are resumable (`paused` only by a caller). */
export type FactoryRunStatus = "pending" | "running" | "completed" | "error" | "halted" | "paused" | "cancelled";
/** The statuses an attempt ends in. */
export type FactoryTerminalStatus = Exclude<FactoryRunStatus, "pending" | "running">;
/** The factory limits whose breach ends an attempt. */
export type FactoryLimitKind = "maxTotalSubagents" | "timeoutSeconds" | "maxAiCredits";
/** Why a backend could not be used (`failure.kind` of `type: "backend"`). */
export type FactoryBackendFailureKind =
    | "unavailable"
    | "timeout"
    | "auth"
    | "model_not_found"
    | "rate_limited"
    | "server_error"
    | "invalid_reply"
    | "not_installed"
    | "misconfigured"
    | "replay_miss";
/** Every `failure.type`. */
export type FactoryFailureType = FactoryFailure["type"];

/** A typed failure: `type` says which family, `kind` which member. */
export type FactoryFailure =
    /** A factory limit stopped the attempt; resume with a raised limit. */
    | { readonly type: "factory_limit_reached"; readonly kind: FactoryLimitKind; readonly message: string }
    /** A host sandbox limit: `fuel`, `memory`, `stack`, `table`, or a limit's name (`maxPromptBytes`, `maxJsonDepth`, ...). */
    | { readonly type: "sandbox_limit"; readonly kind: string; readonly message: string }
    /** The backend could not be used. */
    | { readonly type: "backend"; readonly kind: FactoryBackendFailureKind; readonly message: string }
    /** The journal or store failed (`unreadable_record`: a record that cannot be read). */
    | { readonly type: "storage"; readonly kind?: "unreadable_record"; readonly message: string }
    /** Cancelled by a caller (`declined`: at the consent prompt, before anything ran). */
    | { readonly type: "cancelled"; readonly kind?: "declined"; readonly message: string }
    /** The guest trapped (`unreachable`: a panic). */
    | { readonly type: "trap"; readonly kind?: "unreachable"; readonly message: string }
    /** Paused by a caller (`caller`) or at a checkpoint (`checkpoint`: the envelope's `checkpoint` names it); resumable. */
    | { readonly type: "paused"; readonly kind: "caller" | "checkpoint"; readonly message: string }
    /**
     * `sandbox`: the attempt's sandbox could not be set up; `guest_error`: `run` threw or
     * returned an error; `invalid_result`: the result is not JSON; `invalid_call`: a hook got
     * what it cannot take; `internal`: a host bug; `halted`: the host stopped.
     */
    | {
          readonly type: "sandbox" | "guest_error" | "invalid_result" | "invalid_call" | "internal" | "halted";
          readonly kind?: undefined;
          readonly message: string;
      };

/** What a run consumed over all its attempts. */
export interface FactoryAccounting {
    readonly agentsSpawned: number;
    readonly agentCacheHits: number;
    readonly activeSeconds: number;
    /** AI credits in nano-credits (exact integers; one credit is US$0.01). */
    readonly aiCreditsNano: number;
    /** True when `aiCreditsNano` is a lower bound: some spend has no known cost. */
    readonly aiCreditsAtLeast: boolean;
    /** Uncached prompt tokens. */
    readonly inputTokens: number;
    readonly outputTokens: number;
    /** Prompt tokens read from / written to the provider's prompt cache (not part of `inputTokens`). */
    readonly cacheReadTokens: number;
    readonly cacheWriteTokens: number;
}

/** The backend that answered the latest attempt's subagents. */
export interface FactoryBackendRef {
    /** `dry-run`, `openai`, `cli:claude`, `script:/abs/rules.json`, `replay:/abs/cassette.jsonl`, or a configured name. */
    readonly name: string;
    /** The model given with it (`--model`). */
    readonly model?: string;
    /** sha256 of the configuration it was built from, when it came from a config file. */
    readonly config?: string;
    /** The environment variable that held its API key (the name only). */
    readonly keyEnv?: string;
}

/** The run envelope: what every outcome of a run resolves to. */
export interface FactoryRunResult<TResult extends JsonValue = JsonValue> {
    /** Stable across attempts. */
    readonly runId: string;
    /** The factory's meta name. */
    readonly factory: string;
    readonly status: FactoryRunStatus;
    /** Only when `completed` with a result. */
    readonly result?: TResult;
    /** For `error` (and `cancelled`, `halted`, `paused`). */
    readonly failure?: FactoryFailure;
    /** For a run `paused` at a checkpoint: the key it waits at (`ctx.pause(key)`). */
    readonly checkpoint?: string;
    /** A plain error message, when the failure is best read as text. */
    readonly error?: string;
    readonly accounting: FactoryAccounting;
    /** Attempts started so far. */
    readonly attempts: number;
    readonly backend?: FactoryBackendRef;
    /** The owner session (on envelopes read back from a host). */
    readonly session?: string;
    /** RFC 3339. */
    readonly createdAt: string;
    readonly updatedAt: string;
    /** Monotonic; bumped on every durable change. */
    readonly revision: number;
}
