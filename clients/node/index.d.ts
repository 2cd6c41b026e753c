// Types of @factory/client (index.js): the spec's extension-side factory API over
// `factory serve --http`.

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** Per-invocation limit overrides (each positive when present). */
export interface FactoryLimits {
    maxConcurrentSubagents?: number;
    maxTotalSubagents?: number;
    timeoutSeconds?: number;
    maxAiCredits?: number;
}

export type FactoryRunStatus = "running" | "completed" | "error" | "halted" | "paused" | "cancelled";

/** A typed failure: `type` is the failure type (`factory_limit_reached`, ...), `kind` the member. */
export interface FactoryFailure {
    type: string;
    kind?: string;
    message: string;
}

/** The run envelope (`FactoryRunResult`). */
export interface FactoryRunResult {
    runId: string;
    factory: string;
    status: FactoryRunStatus;
    /** Only for `completed` (absent when the factory returned nothing). */
    result?: JsonValue;
    failure?: FactoryFailure;
    error?: string;
    accounting: {
        agentsSpawned: number;
        agentCacheHits: number;
        activeSeconds: number;
        /** AI credits in nano-credits (one credit is US$0.01); a lower bound when `aiCreditsAtLeast`. */
        aiCreditsNano: number;
        /** True when `aiCreditsNano` is a lower bound: some spend has no known cost. */
        aiCreditsAtLeast: boolean;
        /** Uncached prompt tokens. */
        inputTokens: number;
        outputTokens: number;
        /** Prompt tokens read from / written to the provider's prompt cache (not part of `inputTokens`). */
        cacheReadTokens: number;
        cacheWriteTokens: number;
    };
    attempts: number;
    /** For a run parked `halted` because its backend's quota is spent: when the service resumes it by itself (RFC 3339 UTC). */
    resumeAt?: string;
    /** For a run `paused` at a checkpoint: the key it waits at (answer it with `resume(runId, { input })`). */
    checkpoint?: string;
    session?: string;
    createdAt: string;
    updatedAt: string;
    /** Monotonic; bumped on every durable change. */
    revision: number;
    [key: string]: unknown;
}

/** One progress entry: `event` is `phase`, `log`, `agentQueued`, `agentStarted`, `agentFinished`, `attemptStarted` or `attemptEnded`. */
export interface FactoryProgressEntry {
    seq: number;
    atMs: number;
    /** The phase current when it happened (its title, which is the phase's id). */
    phase?: string;
    event: string;
    [key: string]: unknown;
}

/** A run's detail: its envelope's fields plus phases, prompt-safe agent summaries and the latest progress page. */
export interface FactoryRunDetail extends FactoryRunResult {
    limits: FactoryLimits;
    /** Phase titles entered, in order (a title is the phase's id for getRunProgress). */
    phases: string[];
    agents: Array<{
        label: string; model?: string; status: "ok" | "failed" | "aborted"; spawns: number; creditsNano: number;
        /** Present (true) when `creditsNano` is a lower bound. */
        creditsAtLeast?: boolean;
        inputTokens: number; outputTokens: number; cacheReadTokens?: number; cacheWriteTokens?: number; millis: number;
        /** The per-agent soft limit that ended the call, when one did. */
        endedBy?: "maxTurns" | "maxDurationSeconds";
    }>;
    progress: FactoryProgressEntry[];
}

export interface FactoryMeta {
    name: string;
    description: string;
    phases?: Array<{ title: string; detail?: string }>;
    limits?: FactoryLimits;
}

/** A factory in the authoring form (its `run` is sent as source and must be self-contained). */
export interface FactoryDefinition<TArgs = any, TResult extends JsonValue | void = JsonValue | void> {
    meta: FactoryMeta;
    run: (ctx: any) => Promise<TResult>;
}

export interface DefinedFactory<TArgs = any, TResult extends JsonValue | void = JsonValue | void> extends FactoryDefinition<TArgs, TResult> {
    readonly name: string;
}

/** A factory `joinSession` registered in the session. */
export interface FactoryHandle {
    readonly name: string;
    readonly meta: FactoryMeta;
    readonly sha256: string;
    /** The file's absolute path, or `"authored"` for a defineFactory handle. */
    readonly source: string;
}

export interface FactoryRunUpdatedEvent {
    type: "factory.run_updated";
    id: string;
    timestamp: string;
    parentId: null;
    ephemeral: true;
    data: { runId: string; revision: number };
}

export interface FactoryApi {
    run(nameOrHandle: string | FactoryHandle | DefinedFactory, options?: { args?: JsonValue; limits?: FactoryLimits }): Promise<FactoryRunResult>;
    /** `input`: the answer to the checkpoint a paused run waits at (its `ctx.pause(key)` returns it). */
    resume(runId: string, options?: { limits?: FactoryLimits; input?: JsonValue }): Promise<FactoryRunResult>;
    listRuns(): Promise<FactoryRunResult[]>;
    getRunDetail(runId: string): Promise<FactoryRunDetail>;
    getRunProgress(
        runId: string,
        options?: { phaseId?: string; afterSeq?: number; beforeSeq?: number; limit?: number },
    ): Promise<FactoryProgressEntry[]>;
    getRun(runId: string, options?: { signal?: AbortSignal }): Promise<FactoryRunResult>;
    cancel(runId: string): Promise<FactoryRunResult>;
    /** Pause the running run: its `paused` envelope (`not_running` when no attempt executes). */
    pause(runId: string): Promise<FactoryRunResult>;
    waitForRun(runId: string, options?: { signal?: AbortSignal }): Promise<FactoryRunResult>;
}

export interface FactorySession {
    readonly sessionId: string;
    readonly url: string;
    readonly factories: readonly FactoryHandle[];
    readonly factory: FactoryApi;
    on(type: "factory.run_updated", handler: (event: FactoryRunUpdatedEvent) => void): () => void;
    on(handler: (event: FactoryRunUpdatedEvent) => void): () => void;
    disconnect(): Promise<void>;
    [Symbol.asyncDispose](): Promise<void>;
}

export interface ConnectionOptions {
    /** The service's base URL (default FACTORY_URL, else `http://` + `<stateDir>/http.addr`). */
    url?: string;
    /** The bearer token (default FACTORY_TOKEN, else `<stateDir>/http.token`). */
    token?: string;
    /** The state directory (default FACTORY_STATE_DIR, else $XDG_STATE_HOME/factory, else ~/.local/state/factory). */
    stateDir?: string;
}

export interface JoinSessionOptions extends ConnectionOptions {
    /** Paths or file: URLs of factory files or component directories, and defineFactory handles. */
    factories?: Array<string | URL | DefinedFactory>;
    /** The session's name (default a fresh `node-<uuid>`). */
    session?: string;
    /** waitForRun's periodic re-read, in milliseconds (default 5000). */
    pollIntervalMs?: number;
}

export function joinSession(options?: JoinSessionOptions): Promise<FactorySession>;
export function defineFactory<TArgs = any, TResult extends JsonValue | void = JsonValue | void>(
    definition: FactoryDefinition<TArgs, TResult>,
): DefinedFactory<TArgs, TResult>;
export function isFactoryRunTerminal(status: string | null | undefined): boolean;
export function resolveConnection(options?: ConnectionOptions, env?: Record<string, string | undefined>): { url: string; token: string };

export const FACTORY_RUN_UPDATED: "factory.run_updated";
export const FACTORY_RESUME_ERROR_CODES: readonly ["not_found", "non_resumable", "already_active", "reapproval_declined", "no_approval_provider"];

export class FactoryError extends Error {
    constructor(code: string, message: string, options?: { httpStatus?: number; cause?: unknown });
    readonly code: string;
    readonly httpStatus?: number;
}

export class FactoryResumeError extends FactoryError {
    readonly code: (typeof FACTORY_RESUME_ERROR_CODES)[number];
}
