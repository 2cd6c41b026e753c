// Types of @factory/client (index.js): the spec's extension-side factory API over
// `factory serve --http`. A factory's `ctx` is the JS runner's own (guest-sdk/js).

import type { FactoryContext, FactoryResult } from "../../guest-sdk/js/index.js";

export type { FactoryContext, FactoryResult };

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/**
 * Per-invocation limit overrides: omitted keeps the factory's declared limit, a positive
 * number replaces it, `null` lifts it (no limit of that kind). A resume's `timeoutSeconds`
 * counts the active time of earlier attempts (the attempt gets what is left).
 */
export interface FactoryLimits {
    maxConcurrentSubagents?: number | null;
    maxTotalSubagents?: number | null;
    timeoutSeconds?: number | null;
    maxAiCredits?: number | null;
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
    /** The run's place in creation order (in listings). */
    seq?: number;
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

/**
 * A factory in the spec's form: `run` gets the runner's typed `ctx`, whose `args` are `TArgs`
 * (`defineFactory<TArgs>`); it may use its module's scope (the module is registered).
 */
export interface FactoryDefinition<TArgs = any, TResult extends FactoryResult = FactoryResult> {
    meta: FactoryMeta;
    run: (ctx: FactoryContext<TArgs>) => Promise<TResult> | TResult;
}

export interface DefinedFactory<TArgs = any, TResult extends FactoryResult = FactoryResult> extends FactoryDefinition<TArgs, TResult> {
    readonly name: string;
    /** The module file that called `defineFactory` (registered as `file#name`), or null: `run`'s source is sent alone. */
    readonly module: string | null;
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
    type: "factory.run_updated" | "workflow.run_updated";
    id: string;
    timestamp: string;
    parentId: null;
    ephemeral: true;
    data: { runId: string; revision: number };
}

/** Options of a page by creation sequence (`listRuns(options)`). */
export interface FactoryListRunsOptions {
    /** The runs created after this `seq`, oldest first (walk newer). */
    afterSeq?: number | null;
    /** The newest runs created before this `seq` (walk older); neither cursor: the newest page. */
    beforeSeq?: number | null;
    /** The most ended runs the page holds (default 200, at most 500); running ones come along. */
    limit?: number | null;
}

/** A page of runs by creation sequence. */
export interface FactoryRunsPage {
    /** Oldest first; each has its `seq`. */
    runs: Array<FactoryRunResult & { seq: number }>;
    /** The `seq` of the page's oldest run (the `beforeSeq` of the page before it), null when empty. */
    oldestSeq: number | null;
    /** The `seq` of the page's newest run (the `afterSeq` of the page after it), null when empty. */
    newestSeq: number | null;
    /** Runs newer than this page exist. */
    hasMoreNewer: boolean;
    /** Runs older than this page exist. */
    omittedOlder: boolean;
}

/** An attempt of a run started. */
export interface FactoryRunStartedEvent {
    type: "factory.run_started" | "workflow.run_started";
    id: string;
    timestamp: string;
    parentId: null;
    ephemeral: true;
    data: { runId: string; attempt: number; factoryName: string };
}

/** An attempt of a run settled, with what that attempt consumed. */
export interface FactoryRunSettledEvent {
    type: "factory.run_settled" | "workflow.run_settled";
    id: string;
    timestamp: string;
    parentId: null;
    ephemeral: true;
    data: {
        runId: string;
        status: FactoryRunStatus;
        /** AI credits the attempt spent (`consumedCreditsNano` exactly; a lower bound when `consumedCreditsAtLeast`). */
        consumedCredits: number;
        consumedCreditsNano: number;
        consumedCreditsAtLeast?: boolean;
        /** Subagents the attempt spawned. */
        consumedSubagents: number;
        /** The attempt's active time. */
        elapsedMs: number;
        /** The failure's type, when the attempt failed. */
        failureType?: string;
    };
}

/** A run this session started with `notifyOnComplete: true` ended. */
export interface FactoryRunCompletedEvent {
    type: "factory.run_completed" | "workflow.run_completed";
    id: string;
    timestamp: string;
    parentId: null;
    ephemeral: true;
    data: {
        runId: string;
        factory: string;
        status: FactoryRunStatus;
        /** The result's JSON text, cut at 500 characters (then ending in `…`); absent without a result. */
        resultPreview?: string;
        failureType?: string;
    };
}

/** A run this session started with `logPhaseNames: true` entered a phase. */
export interface FactoryPhaseLoggedEvent {
    type: "factory.phase_logged" | "workflow.phase_logged";
    id: string;
    timestamp: string;
    parentId: null;
    ephemeral: true;
    data: { runId: string; phase: string };
}

export type FactorySessionEvent =
    | FactoryRunUpdatedEvent
    | FactoryRunStartedEvent
    | FactoryRunSettledEvent
    | FactoryRunCompletedEvent
    | FactoryPhaseLoggedEvent;

/** The options of `session.factory.run`. */
export interface FactoryRunOptions<TArgs> {
    args?: TArgs;
    limits?: FactoryLimits;
    resumeFromRunId?: string;
    /** Tell this session when the run ends: a `factory.run_completed` event (default false, as for upstream's programmatic callers). */
    notifyOnComplete?: boolean;
    /** Tell this session each phase the run enters: `factory.phase_logged` events (default false). */
    logPhaseNames?: boolean;
}

export interface FactoryApi {
    /** With `resumeFromRunId`, resumes that run instead (as `resume`). A handle's `args` are its `TArgs`. */
    run<TArgs, TResult extends FactoryResult>(handle: DefinedFactory<TArgs, TResult>, options?: FactoryRunOptions<TArgs>): Promise<FactoryRunResult>;
    run(nameOrHandle: string | FactoryHandle, options?: FactoryRunOptions<JsonValue>): Promise<FactoryRunResult>;
    /** `input`: the answer to the checkpoint a paused run waits at (its `ctx.pause(key)` returns it). */
    resume(
        runId: string,
        options?: { limits?: FactoryLimits; input?: JsonValue; notifyOnComplete?: boolean; logPhaseNames?: boolean },
    ): Promise<FactoryRunResult>;
    listRuns(): Promise<FactoryRunResult[]>;
    listRuns(options: FactoryListRunsOptions): Promise<FactoryRunsPage>;
    getRunDetail(runId: string): Promise<FactoryRunDetail>;
    getRunProgress(
        runId: string,
        options?: { phaseId?: string; afterSeq?: number; beforeSeq?: number; limit?: number },
    ): Promise<FactoryProgressEntry[]>;
    getRun(runId: string, options?: { signal?: AbortSignal }): Promise<FactoryRunResult>;
    cancel(runId: string): Promise<FactoryRunResult>;
    /** Pause the running run: its `paused` envelope (`not_running` when no attempt executes). */
    pause(runId: string): Promise<FactoryRunResult>;
    /** Delete the ended run and its journal (`already_active` while it executes, `not_found` when unknown). */
    remove(runId: string): Promise<{ runId: string; removed: true }>;
    /**
     * Delete this session's ended runs a retention policy no longer keeps (`keepDays`,
     * `keepLast`: at least one); with `dryRun`, only list them.
     */
    gc(options: { keepDays?: number; keepLast?: number; dryRun?: boolean }): Promise<{
        removed: string[];
        kept: number;
        dryRun: boolean;
    }>;
    waitForRun(runId: string, options?: { signal?: AbortSignal }): Promise<FactoryRunResult>;
}

export interface FactorySession {
    readonly sessionId: string;
    readonly url: string;
    readonly factories: readonly FactoryHandle[];
    readonly factory: FactoryApi;
    /** The same API under upstream's workflow names: resume refusals are `WorkflowResumeError`s with `workflow_*` codes. */
    readonly workflow: FactoryApi;
    readonly workflows: readonly FactoryHandle[];
    on(type: "factory.run_updated" | "workflow.run_updated", handler: (event: FactoryRunUpdatedEvent) => void): () => void;
    on(type: "factory.run_started" | "workflow.run_started", handler: (event: FactoryRunStartedEvent) => void): () => void;
    on(type: "factory.run_settled" | "workflow.run_settled", handler: (event: FactoryRunSettledEvent) => void): () => void;
    on(type: "factory.run_completed" | "workflow.run_completed", handler: (event: FactoryRunCompletedEvent) => void): () => void;
    on(type: "factory.phase_logged" | "workflow.phase_logged", handler: (event: FactoryPhaseLoggedEvent) => void): () => void;
    on(handler: (event: FactorySessionEvent) => void): () => void;
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
    /** Paths or file: URLs of factory files or component directories, defineFactory handles, and plain `{ meta, run }` (run's source alone). */
    factories?: Array<string | URL | DefinedFactory<any, any> | FactoryDefinition<any, any>>;
    /** The same as `factories`, under the workflow name (give one of the two). */
    workflows?: Array<string | URL | DefinedFactory<any, any> | FactoryDefinition<any, any>>;
    /** The session's name (default FACTORY_SESSION, else a fresh `node-<uuid>`). */
    session?: string;
    /** waitForRun's periodic re-read, in milliseconds (default 5000). */
    pollIntervalMs?: number;
    /**
     * Asked when a run or resume would start a factory this machine does not trust; resolve
     * `{ kind: "approved" }` (`always: true`: trust its sha256 from now on) to start it,
     * anything else to decline (the call rejects with FactoryError `declined`). Without it
     * such a start rejects with `no_approval_provider`.
     */
    onPermissionRequest?: (
        request: FactoryPermissionRequest,
        invocation: { sessionId: string },
    ) => FactoryPermissionResult | Promise<FactoryPermissionResult>;
}

/** The consent question for a factory the machine does not trust (permission kind `factory`). */
export interface FactoryPermissionRequest {
    kind: "factory";
    /** What would start: a fresh run, or a resume of one. */
    operation: "run" | "resume";
    /** The factory's name. */
    factoryName: string;
    /** The key an approval is for: the sha256 of the component, or of a script's source. */
    approvalKey: string;
    /** The same as `approvalKey`. */
    sha256: string;
    /** The backend its subagents would use. */
    backend: string;
    /** The limits it would run under (declared, with the call's overrides). */
    limits: FactoryLimits;
    /** Its declared phases. */
    phases: string[];
    /** The host directories it could read. */
    grants: string[];
    /** The service's pending approval this question answers. */
    approvalId: string;
}

/** An answer to a `FactoryPermissionRequest`: `approved` starts it (once, or `always`). */
export type FactoryPermissionResult =
    | { kind: "approved"; always?: boolean }
    | { kind: "denied-interactively-by-user" | "denied-by-rules" | "denied-no-approval-rule-and-could-not-request-from-user" };

export function joinSession(options?: JoinSessionOptions): Promise<FactorySession>;
/** Define a factory; `defineFactory<TArgs>` types `ctx.args` and the `args` of `session.factory.run(handle)`. */
export function defineFactory<TArgs = any, TResult extends FactoryResult = FactoryResult>(
    definition: FactoryDefinition<TArgs, TResult>,
): DefinedFactory<TArgs, TResult>;
export function defineWorkflow<TArgs = any, TResult extends FactoryResult = FactoryResult>(
    definition: FactoryDefinition<TArgs, TResult>,
): DefinedFactory<TArgs, TResult>;
/** One table of the store (`stats().tables`). */
export interface FactoryStoreTable {
    name: string;
    /** Rows. */
    entries: number;
    /** Bytes of the rows' keys and values as stored. */
    storedBytes: number;
    leafPages: number;
    branchPages: number;
    /** Bytes of the table's pages that hold nothing. */
    fragmentedBytes: number;
    /** Bytes of its branch pages' keys and other metadata. */
    metadataBytes: number;
}

/** One part of the store's bytes (`stats().parts`): journal values, progress, run records, ... */
export interface FactoryStorePart {
    part: string;
    bytes: number;
    /** Rows (0 for the file's own parts: page overhead, free pages). */
    rows: number;
}

/** Where the store's bytes go, as `factory stats --json` prints it; the parts add up to `fileBytes`. */
export interface FactoryStoreStats {
    fileBytes: number;
    /** The disk space the file takes. */
    diskBytes: number;
    pageSize: number;
    allocatedPages: number;
    tables: FactoryStoreTable[];
    parts: FactoryStorePart[];
}

export interface StatsOptions extends ConnectionOptions {
    /** Ask as this session instead of the owner: refused (`bad_request`), the store covering every session. */
    session?: string;
}

/**
 * Where the store's bytes go, asked as the owner (the token's holder); `null` for a store that
 * does not measure itself.
 */
export function stats(options?: StatsOptions): Promise<FactoryStoreStats | null>;
export function isFactoryRunTerminal(status: string | null | undefined): boolean;
export function isWorkflowRunTerminal(status: string | null | undefined): boolean;
export function resolveConnection(options?: ConnectionOptions, env?: Record<string, string | undefined>): { url: string; token: string };

export const FACTORY_RUN_UPDATED: "factory.run_updated";
export const FACTORY_RUN_STARTED: "factory.run_started";
export const FACTORY_RUN_SETTLED: "factory.run_settled";
export const FACTORY_RUN_COMPLETED: "factory.run_completed";
export const FACTORY_PHASE_LOGGED: "factory.phase_logged";
export const WORKFLOW_RUN_UPDATED: "workflow.run_updated";
export const FACTORY_RESUME_ERROR_CODES: readonly [
    "not_found",
    "non_resumable",
    "already_active",
    "factory_already_running",
    "factory_limits_invalid",
    "factory_session_disposed",
    "factory_storage_unavailable",
    "factory_storage_corrupt",
];
export const WORKFLOW_RESUME_ERROR_CODES: readonly [
    "not_found",
    "non_resumable",
    "workflow_run_not_resumable",
    "already_active",
    "workflow_already_running",
    "workflow_limits_invalid",
    "workflow_session_disposed",
    "workflow_storage_unavailable",
    "workflow_storage_corrupt",
];

export class FactoryError extends Error {
    constructor(code: string, message: string, options?: { httpStatus?: number; cause?: unknown });
    readonly code: string;
    readonly httpStatus?: number;
}

export class FactoryResumeError extends FactoryError {
    readonly code: (typeof FACTORY_RESUME_ERROR_CODES)[number];
    /** The service's code the resume code was mapped from (`invalid_limits`, `storage_unavailable`, ...). */
    readonly serviceCode: string;
}

export class WorkflowResumeError extends FactoryError {
    readonly code: (typeof WORKFLOW_RESUME_ERROR_CODES)[number];
    readonly serviceCode: string;
}
