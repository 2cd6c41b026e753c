// @factory/client: the Copilot SDK's extension-side factory API — `joinSession`,
// `session.factory.run/resume/listRuns/getRunDetail/getRunProgress/getRun/cancel/pause/remove/gc/waitForRun`,
// `isFactoryRunTerminal`, `FactoryResumeError`, the `factory.run_updated` event and the owner's
// `stats` (where the store's bytes go), and the same
// under upstream's newer Dynamic Workflows names (`defineWorkflow`, `session.workflow.*`,
// `WorkflowResumeError`, `workflow.*` events) — for a
// Node program, over the HTTP API of `factory serve --http`. A `defineFactory` handle registers
// the module that defined it, so its `run` keeps that module's scope. No dependencies beyond Node >= 18
// (global fetch, AbortSignal, TextDecoder; Server-Sent Events parsed from fetch's body).
//
// One `joinSession` is one session of the service: the runs it starts, the factories it
// registers and the runs it can see, follow and control are that session's only (every call
// carries the `Factory-Session` header). See README.md ("Node client") for the mapping of the
// spec's shapes onto the service's.

import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { isAbsolute, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { randomUUID } from "node:crypto";

/** The event a session emits when one of its runs changes durably. */
export const FACTORY_RUN_UPDATED = "factory.run_updated";

/** The event a session emits when an attempt of one of its runs starts: `{ runId, attempt, factoryName }`. */
export const FACTORY_RUN_STARTED = "factory.run_started";

/**
 * The event a session emits when an attempt of one of its runs settles: `{ runId, status,
 * consumedCredits, consumedSubagents, elapsedMs, failureType? }` (what that attempt consumed).
 */
export const FACTORY_RUN_SETTLED = "factory.run_settled";

/**
 * The event a session emits when a run it started with `notifyOnComplete: true` ends:
 * `{ runId, factory, status, resultPreview?, failureType? }` (upstream's completion notice).
 */
export const FACTORY_RUN_COMPLETED = "factory.run_completed";

/** The event a session emits per phase a run it started with `logPhaseNames: true` enters: `{ runId, phase }`. */
export const FACTORY_PHASE_LOGGED = "factory.phase_logged";

/** The longest result preview a `factory.run_completed` event carries, in characters of JSON text. */
const RESULT_PREVIEW_CHARS = 500;

/** Progress entries read per page while logging a run's phases. */
const PHASE_PAGE = 1000;

/** The statuses a run never leaves. */
const TERMINAL_STATUSES = new Set(["completed", "error", "halted", "paused", "cancelled"]);

/** The codes a `FactoryResumeError` carries (upstream's pre-execution resume failures). */
export const FACTORY_RESUME_ERROR_CODES = Object.freeze([
    "not_found",
    "non_resumable",
    "already_active",
    "factory_already_running",
    "factory_limits_invalid",
    "factory_session_disposed",
    "factory_storage_unavailable",
    "factory_storage_corrupt",
]);

/** The codes a `WorkflowResumeError` carries: the workflow surface's names of the same failures. */
export const WORKFLOW_RESUME_ERROR_CODES = Object.freeze([
    "not_found",
    "non_resumable",
    "workflow_run_not_resumable",
    "already_active",
    "workflow_already_running",
    "workflow_limits_invalid",
    "workflow_session_disposed",
    "workflow_storage_unavailable",
    "workflow_storage_corrupt",
]);

/** The event a session emits, under the workflow name, when one of its runs changes durably. */
export const WORKFLOW_RUN_UPDATED = "workflow.run_updated";

/**
 * A resume refusal's code on `surface` (`factory` or `workflow`) from the service's code
 * (README "HTTP API"), or null when the refusal is not one of a resume's own.
 */
function resumeCode(surface, serviceCode) {
    switch (serviceCode) {
        case "not_found":
        case "non_resumable":
        case "already_active":
            return serviceCode;
        case "invalid_limits":
            return `${surface}_limits_invalid`;
        case "session_disposed":
            return `${surface}_session_disposed`;
        case "storage_unavailable":
        case "unavailable":
            return `${surface}_storage_unavailable`;
        case "storage_corrupt":
            return `${surface}_storage_corrupt`;
        default:
            return null;
    }
}

/** The header naming the session a call acts as. */
const SESSION_HEADER = "factory-session";

/** The most runs the service lists in one page of `GET /api/runs`. */
const RUNS_PAGE = 1000;

/** How often `waitForRun` re-reads the run besides the `run_updated` it follows. */
const DEFAULT_POLL_INTERVAL_MS = 5_000;

/** The longest line of the event stream accepted (a larger one drops the connection). */
const MAX_EVENT_LINE_CHARS = 8 << 20;

/** The event stream's reconnect delay: first, and at most (it doubles in between). */
const RECONNECT_MS = [250, 5_000];

/** Whether `status` settles an attempt: `completed`, `error`, `halted`, `paused`, `cancelled`. */
export function isFactoryRunTerminal(status) {
    return TERMINAL_STATUSES.has(status);
}

/** `isFactoryRunTerminal` under the workflow name. */
export function isWorkflowRunTerminal(status) {
    return isFactoryRunTerminal(status);
}

/** A refusal or failure of the factory service, with its error code (`unknown_factory`, ...). */
export class FactoryError extends Error {
    constructor(code, message, options = {}) {
        super(message, options.cause === undefined ? undefined : { cause: options.cause });
        this.name = "FactoryError";
        /** The service's error code (README "HTTP API"), or `unavailable` when unreachable. */
        this.code = code;
        /** The HTTP status of the answer, when there was one. */
        this.httpStatus = options.httpStatus;
    }
}

/**
 * A resume that failed before an attempt started; `code` is one of FACTORY_RESUME_ERROR_CODES,
 * `serviceCode` the service's own code for it (`invalid_limits`, `storage_unavailable`, ...).
 */
export class FactoryResumeError extends FactoryError {
    constructor(code, message, options = {}) {
        super(code, message, options);
        this.name = "FactoryResumeError";
        /** The service's code the resume code was mapped from. */
        this.serviceCode = options.serviceCode ?? code;
    }
}

/** A resume of `session.workflow` that failed before an attempt started; `code` is one of WORKFLOW_RESUME_ERROR_CODES. */
export class WorkflowResumeError extends FactoryError {
    constructor(code, message, options = {}) {
        super(code, message, options);
        this.name = "WorkflowResumeError";
        /** The service's code the resume code was mapped from. */
        this.serviceCode = options.serviceCode ?? code;
    }
}

/**
 * A factory in the spec's authoring form, to pass to `joinSession({ factories })`: `meta` and
 * `run(ctx)`. The handle remembers the module that called `defineFactory` (a `.js`, `.mjs`,
 * `.ts` or `.mts` file): `joinSession` registers that module (`file#name`), which the service
 * evaluates in its sandbox, so `run` may use the module's imports, helpers and constants
 * (imports resolve within the module's directory; the client's own import, `@factory/client`,
 * is the sandbox's runtime there). A handle whose caller is no such file (an eval, a REPL)
 * registers `run`'s source alone, which then must be self-contained. Returns the handle.
 */
export function defineFactory(definition) {
    return define("defineFactory", definition, callerModule(defineFactory));
}

/** `defineFactory` under the workflow name (same semantics): a handle for `joinSession({ workflows })`. */
export function defineWorkflow(definition) {
    return define("defineWorkflow", definition, callerModule(defineWorkflow));
}

/** The file endings of a module the service's JS runner loads (TypeScript is type-stripped). */
const MODULE_ENDINGS = [".js", ".mjs", ".ts", ".mts"];

/**
 * The absolute path of the module whose code called `fn` (from V8's call sites), or null when
 * that code is not in such a file (`node -e`, a REPL, a `data:` URL, CommonJS `.cjs`).
 */
function callerModule(fn) {
    const holder = {};
    const prepare = Error.prepareStackTrace;
    let file = null;
    try {
        Error.prepareStackTrace = (_, sites) => sites;
        Error.captureStackTrace(holder, fn);
        const sites = holder.stack;
        file = Array.isArray(sites) && sites.length > 0 ? sites[0].getFileName() : null;
    } catch {
        file = null;
    } finally {
        Error.prepareStackTrace = prepare;
    }
    if (typeof file !== "string") return null;
    if (file.startsWith("file:")) file = fileURLToPath(file);
    if (!isAbsolute(file) || !MODULE_ENDINGS.some((ending) => file.endsWith(ending))) return null;
    return file;
}

function define(caller, definition, module) {
    const meta = definition?.meta;
    if (typeof meta?.name !== "string" || meta.name === "") {
        throw new TypeError(`${caller}: \`meta.name\` must be a non-empty string`);
    }
    if (typeof definition.run !== "function") {
        throw new TypeError(`${caller}: \`run\` of \`${meta.name}\` must be a function`);
    }
    return Object.freeze({ name: meta.name, meta, run: definition.run, module });
}

/** The state directory the service uses by default (as `factory --state-dir` resolves it). */
function defaultStateDir(env) {
    if (env.FACTORY_STATE_DIR) return env.FACTORY_STATE_DIR;
    if (env.XDG_STATE_HOME) return join(env.XDG_STATE_HOME, "factory");
    return join(homedir(), ".local", "state", "factory");
}

function readStateFile(dir, name, what) {
    const path = join(dir, name);
    try {
        return readFileSync(path, "utf8").trim();
    } catch (e) {
        throw new FactoryError(
            "unavailable",
            `no ${what} given and ${path} cannot be read (${e.code ?? e.message}): start \`factory serve --http 127.0.0.1:PORT\`, ` +
                "or pass `url`/`token` (or set FACTORY_URL/FACTORY_TOKEN, or FACTORY_STATE_DIR)",
            { cause: e },
        );
    }
}

/**
 * Where the service is and its token: `url`/`token` options, else FACTORY_URL/FACTORY_TOKEN,
 * else the `http.addr`/`http.token` files of the state directory (`stateDir`, else
 * FACTORY_STATE_DIR, else $XDG_STATE_HOME/factory, else ~/.local/state/factory).
 */
export function resolveConnection({ url, token, stateDir } = {}, env = process.env) {
    const dir = stateDir ?? defaultStateDir(env);
    const base = url ?? env.FACTORY_URL ?? `http://${readStateFile(dir, "http.addr", "url")}`;
    const bearer = token ?? env.FACTORY_TOKEN ?? readStateFile(dir, "http.token", "token");
    return { url: new URL(base).origin, token: bearer };
}

/** The service's HTTP API as one session sees it. */
class Transport {
    constructor(url, token, session) {
        this.url = url;
        /** The session the calls act as. */
        this.session = session;
        this.headers = { authorization: `Bearer ${token}` };
        // No session: the call acts as the owner (the token's holder), as `stats` does.
        if (session !== null) this.headers[SESSION_HEADER] = session;
        /** Set by `session.disconnect()`: runs and resumes are refused from then on. */
        this.disposed = false;
    }

    async request(method, path, { body, signal } = {}) {
        const headers = { ...this.headers };
        if (body !== undefined) headers["content-type"] = "application/json";
        let response;
        try {
            response = await fetch(new URL(path, this.url), {
                method,
                headers,
                body: body === undefined ? undefined : JSON.stringify(body),
                signal,
            });
        } catch (e) {
            if (signal?.aborted) throw signal.reason;
            throw new FactoryError("unavailable", `the factory service at ${this.url} cannot be reached: ${e.cause?.message ?? e.message}`, {
                cause: e,
            });
        }
        const text = await response.text();
        let value = null;
        if (text !== "") {
            try {
                value = JSON.parse(text);
            } catch {
                throw new FactoryError("error", `${method} ${path}: the service answered ${response.status} with no JSON`, {
                    httpStatus: response.status,
                });
            }
        }
        if (!response.ok) {
            const code = typeof value?.code === "string" ? value.code : "error";
            const message = typeof value?.message === "string" ? value.message : `${method} ${path}: HTTP ${response.status}`;
            throw new FactoryError(code, message, { httpStatus: response.status });
        }
        return value;
    }
}

/** Read Server-Sent Events from a fetch body, calling `onEvent(name, data)` per event. */
async function readEvents(body, onEvent) {
    const decoder = new TextDecoder();
    let buffer = "";
    let name = "message";
    let data = [];
    const line = (text) => {
        if (text === "") {
            if (data.length > 0) onEvent(name, data.join("\n"));
            name = "message";
            data = [];
            return;
        }
        if (text.startsWith(":")) return;
        const colon = text.indexOf(":");
        const field = colon < 0 ? text : text.slice(0, colon);
        let value = colon < 0 ? "" : text.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") name = value;
        else if (field === "data") data.push(value);
    };
    for await (const chunk of body) {
        buffer += decoder.decode(chunk, { stream: true });
        let end;
        while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
            const newline = buffer.startsWith("\r\n", end) ? 2 : 1;
            line(buffer.slice(0, end));
            buffer = buffer.slice(end + newline);
        }
        if (buffer.length > MAX_EVENT_LINE_CHARS) {
            throw new FactoryError("error", `the event stream sent a line longer than ${MAX_EVENT_LINE_CHARS} characters`);
        }
    }
}

/**
 * The session's events: one `/api/events` stream, open while anyone listens (so a program
 * with no listener and no wait exits), reconnected after a drop.
 */
class Events {
    constructor(transport) {
        this.transport = transport;
        this.listeners = new Map();
        this.openListeners = new Set();
        this.count = 0;
        this.controller = null;
        this.running = false;
        this.closed = false;
        this.wake = null;
    }

    on(type, handler) {
        if (this.closed) throw new FactoryError("error", "this session is closed");
        let set = this.listeners.get(type);
        if (!set) this.listeners.set(type, (set = new Set()));
        // One registration per call, even of the same function twice.
        const entry = { handler };
        set.add(entry);
        this.count += 1;
        this.start();
        let removed = false;
        return () => {
            if (removed) return;
            removed = true;
            set.delete(entry);
            this.count -= 1;
            if (this.count === 0) this.stop();
        };
    }

    /** Call `handler` each time the stream (re)opens, while registered. */
    onOpen(handler) {
        this.openListeners.add(handler);
        return () => this.openListeners.delete(handler);
    }

    dispatch(type, event) {
        // `workflow.*` listeners hear the same events under the workflow name.
        const alias = type.startsWith("factory.") ? `workflow.${type.slice("factory.".length)}` : null;
        if (alias !== null) {
            for (const { handler } of [...(this.listeners.get(alias) ?? [])]) {
                try {
                    handler({ ...event, type: alias });
                } catch (e) {
                    queueMicrotask(() => {
                        throw e;
                    });
                }
            }
        }
        for (const key of [type, "*"]) {
            for (const { handler } of [...(this.listeners.get(key) ?? [])]) {
                try {
                    handler(event);
                } catch (e) {
                    // As EventTarget does: a throwing listener is reported, the others still run.
                    queueMicrotask(() => {
                        throw e;
                    });
                }
            }
        }
    }

    start() {
        if (this.running || this.closed || this.count === 0) return;
        this.running = true;
        this.loop().finally(() => {
            this.running = false;
            if (this.count > 0 && !this.closed) this.start();
        });
    }

    stop() {
        this.controller?.abort();
        this.wake?.();
    }

    close() {
        this.closed = true;
        this.listeners.clear();
        this.count = 0;
        this.stop();
    }

    async loop() {
        let delay = RECONNECT_MS[0];
        while (this.count > 0 && !this.closed) {
            const controller = new AbortController();
            this.controller = controller;
            try {
                const response = await fetch(new URL("/api/events", this.transport.url), {
                    headers: { ...this.transport.headers, accept: "text/event-stream" },
                    signal: controller.signal,
                });
                if (!response.ok || !response.body) {
                    const text = await response.text().catch(() => "");
                    throw new FactoryError("error", `GET /api/events: HTTP ${response.status} ${text.slice(0, 200)}`);
                }
                delay = RECONNECT_MS[0];
                for (const handler of [...this.openListeners]) handler();
                await readEvents(response.body, (name, data) => this.received(name, data));
            } catch {
                // Dropped, refused or stopped: reconnect below while someone listens.
            }
            if (this.count === 0 || this.closed) return;
            // Wait before reconnecting; a session closed or left meanwhile wakes it at once.
            await new Promise((done) => {
                const timer = setTimeout(done, delay);
                this.wake = () => {
                    clearTimeout(timer);
                    done();
                };
            });
            this.wake = null;
            delay = Math.min(delay * 2, RECONNECT_MS[1]);
        }
    }

    received(name, data) {
        if (name !== "run_updated" && name !== "run_started" && name !== "run_settled") return;
        let payload;
        try {
            payload = JSON.parse(data);
        } catch {
            return;
        }
        if (name !== "run_updated") {
            if (typeof payload?.runId !== "string") return;
            const type = name === "run_started" ? FACTORY_RUN_STARTED : FACTORY_RUN_SETTLED;
            this.dispatch(type, { id: randomUUID(), timestamp: new Date().toISOString(), parentId: null, ephemeral: true, type, data: payload });
            return;
        }
        if (typeof payload?.runId !== "string" || !Number.isSafeInteger(payload?.revision)) return;
        this.dispatch(FACTORY_RUN_UPDATED, {
            id: randomUUID(),
            timestamp: new Date().toISOString(),
            parentId: null,
            ephemeral: true,
            type: FACTORY_RUN_UPDATED,
            data: { runId: payload.runId, revision: payload.revision },
        });
    }
}

/** The `factory.run_completed` data of a settled envelope: its status and a bounded preview of its result. */
function completion(envelope) {
    const data = { runId: envelope.runId, factory: envelope.factory, status: envelope.status };
    if (envelope.result !== undefined) {
        const text = JSON.stringify(envelope.result);
        data.resultPreview = text.length > RESULT_PREVIEW_CHARS ? `${text.slice(0, RESULT_PREVIEW_CHARS)}…` : text;
    }
    if (envelope.failure?.type) data.failureType = envelope.failure.type;
    return data;
}

function runPath(runId, rest = "") {
    if (typeof runId !== "string" || runId === "") throw new TypeError("a run id must be a non-empty string");
    return `/api/runs/${encodeURIComponent(runId)}${rest}`;
}

/**
 * `session.factory` (and `session.workflow`, the same calls under upstream's workflow names:
 * `WorkflowResumeError` and `workflow_*` codes): the spec's run, resume and observe API for
 * one session.
 */
class FactoryApi {
    #transport;
    #events;
    #pollIntervalMs;
    #surface;
    #onPermissionRequest;

    constructor(transport, events, pollIntervalMs, surface = "factory", onPermissionRequest = undefined) {
        this.#transport = transport;
        this.#events = events;
        this.#pollIntervalMs = pollIntervalMs;
        this.#surface = surface;
        this.#onPermissionRequest = onPermissionRequest;
    }

    /**
     * What a start body says about consent: with an `onPermissionRequest` callback, an
     * untrusted factory comes back at once as a pending approval (answered by `#started`);
     * without, the service refuses it (`no_approval_provider`).
     */
    #consent(body) {
        if (typeof this.#onPermissionRequest === "function") body.approvalWaitSeconds = 0;
        else body.ask = false;
        return body;
    }

    /**
     * The run id a start answered with; a pending approval is put to `onPermissionRequest`
     * (permission kind `factory`) and answered through the API: approved, the run's id;
     * declined (or the callback failed), a FactoryError `declined` (nothing started).
     */
    async #started(answer) {
        if (answer?.status !== "pending_approval") return answer.runId;
        const approval = answer.approval;
        const q = approval.question;
        const request = Object.freeze({
            kind: "factory",
            operation: q.operation,
            factoryName: q.factory,
            approvalKey: q.sha256,
            sha256: q.sha256,
            backend: q.backend,
            limits: q.limits,
            phases: q.phases,
            grants: q.grants,
            approvalId: approval.id,
        });
        const path = `/api/approvals/${encodeURIComponent(approval.id)}`;
        let result;
        try {
            result = await this.#onPermissionRequest(request, { sessionId: this.#transport.session });
        } catch (e) {
            await this.#transport.request("POST", `${path}/decline`).catch(() => {});
            throw e;
        }
        if (result?.kind !== "approved") {
            await this.#transport.request("POST", `${path}/decline`);
            throw new FactoryError(
                "declined",
                `factory \`${q.factory}\` (sha256 ${q.sha256}) was not approved to ${q.operation}${result?.kind ? ` (${result.kind})` : ""}; nothing started`,
            );
        }
        const approved = await this.#transport.request("POST", `${path}/approve`, { body: { always: result.always === true } });
        return approved.state.runId;
    }

    /** The refusal of a call after the session was disconnected, or null while it is open. */
    #disposed() {
        if (!this.#transport.disposed) return null;
        return new FactoryError(`${this.#surface}_session_disposed`, "this session is disconnected: join a session again");
    }

    /**
     * Run a factory by registered name or handle (from `joinSession`'s `factories` or
     * `defineFactory`); resolves with the run's terminal envelope for every outcome. Rejects
     * (FactoryError) only when no run exists: `unknown_factory`, `invalid_limits`, ...
     * `notifyOnComplete` / `logPhaseNames` (also for `resume`): see `#settle`.
     */
    async run(nameOrHandle, options = {}) {
        // `run(name, { resumeFromRunId })` resumes that run (same id and args) instead.
        if (options.resumeFromRunId !== undefined && options.resumeFromRunId !== null) {
            const { limits, input, notifyOnComplete, logPhaseNames } = options;
            return this.resume(options.resumeFromRunId, { limits, input, notifyOnComplete, logPhaseNames });
        }
        const disposed = this.#disposed();
        if (disposed) throw disposed;
        const name = typeof nameOrHandle === "string" ? nameOrHandle : (nameOrHandle?.name ?? nameOrHandle?.meta?.name);
        if (typeof name !== "string" || name === "") {
            throw new TypeError("session.factory.run: give a factory name or a handle from joinSession/defineFactory");
        }
        const answer = await this.#transport.request("POST", "/api/runs", {
            body: this.#consent({ name, args: options.args, limits: options.limits }),
        });
        return this.#settle(await this.#started(answer), options);
    }

    /**
     * Wait for the run to settle, telling this session what `options` asked (upstream's run
     * options for the session that started it, which here is this program): with
     * `logPhaseNames`, a `factory.phase_logged` event per phase the run enters (read from its
     * durable progress, so none is missed); with `notifyOnComplete`, a `factory.run_completed`
     * event when it ends.
     */
    async #settle(runId, options, phasesAfter = 0) {
        const phases = options.logPhaseNames === true ? this.#logPhases(runId, phasesAfter) : null;
        let envelope;
        try {
            envelope = await this.waitForRun(runId);
        } finally {
            await phases?.finish();
        }
        if (options.notifyOnComplete === true) this.#tell(FACTORY_RUN_COMPLETED, completion(envelope));
        return envelope;
    }

    /** Emit `type` with `data` to this session's listeners (and under the workflow name). */
    #tell(type, data) {
        this.#events.dispatch(type, { id: randomUUID(), timestamp: new Date().toISOString(), parentId: null, ephemeral: true, type, data });
    }

    /** Follow the run's phase entries after seq `after`, telling each; `finish()` reads the rest and stops. */
    #logPhases(runId, after) {
        let chain = Promise.resolve();
        const read = () => {
            chain = chain.then(async () => {
                for (;;) {
                    const page = await this.getRunProgress(runId, { afterSeq: after, limit: PHASE_PAGE });
                    for (const entry of page) {
                        after = Math.max(after, entry.seq);
                        if (entry.event === "phase") this.#tell(FACTORY_PHASE_LOGGED, { runId, phase: entry.title ?? entry.phase });
                    }
                    if (page.length < PHASE_PAGE) return;
                }
            }).catch(() => {
                // Unreachable for now: the next update or the final read tries again.
            });
            return chain;
        };
        const off = this.#events.on(FACTORY_RUN_UPDATED, (event) => event.data.runId === runId && read());
        read();
        return {
            finish: async () => {
                off();
                await read();
            },
        };
    }

    /**
     * Resume a run by id (same args, journaled work replays), with limits raised and, for a
     * run paused at a checkpoint, `input` (what its `ctx.pause(key)` returns); resolves with
     * the terminal envelope. A failure before the attempt starts throws
     * FactoryResumeError (`not_found`, `non_resumable`, `already_active`,
     * `reapproval_declined`, `no_approval_provider`); other refusals (`invalid_limits`,
     * `backend_unavailable`) throw FactoryError.
     */
    async resume(runId, options = {}) {
        let started;
        let phasesAfter = 0;
        try {
            if (this.#transport.disposed) throw new FactoryError("session_disposed", "this session is disconnected: join a session again");
            const body = this.#consent({ limits: options.limits });
            // The answer to the checkpoint the run waits at (its `ctx.pause(key)` returns it).
            if (options.input !== undefined) body.input = options.input;
            // Phases are told from the resumed attempt on: after the run's latest entry now.
            if (options.logPhaseNames === true) phasesAfter = (await this.getRunProgress(runId, { limit: 1 })).at(-1)?.seq ?? 0;
            started = { runId: await this.#started(await this.#transport.request("POST", runPath(runId, "/resume"), { body })) };
        } catch (e) {
            const code = e instanceof FactoryError ? resumeCode(this.#surface, e.code) : null;
            if (code !== null) {
                const Refusal = this.#surface === "workflow" ? WorkflowResumeError : FactoryResumeError;
                throw new Refusal(code, e.message, { httpStatus: e.httpStatus, cause: e, serviceCode: e.code });
            }
            throw e;
        }
        return this.#settle(started.runId, options, phasesAfter);
    }

    /**
     * The session's runs in durable creation order, as summaries (envelopes without `result`,
     * whose size is `resultBytes`; `getRun` reads one whole), asked a page at a time.
     * Given options `{ afterSeq, beforeSeq, limit }`, one page by creation sequence instead:
     * `{ runs, oldestSeq, newestSeq, hasMoreNewer, omittedOlder }`, the newest page without a
     * cursor, at most `limit` ended runs (default 200, at most 500; running ones come along).
     */
    async listRuns(options) {
        if (options !== undefined && options !== null) {
            const query = new URLSearchParams();
            for (const key of ["afterSeq", "beforeSeq", "limit"]) {
                const value = options[key];
                if (value === undefined || value === null) continue;
                if (!Number.isSafeInteger(value) || value < (key === "limit" ? 1 : 0)) {
                    throw new TypeError(`listRuns: \`${key}\` must be a ${key === "limit" ? "positive" : "non-negative"} integer`);
                }
                query.set(key, String(value));
            }
            const text = query.toString();
            return this.#transport.request("GET", `/api/runs/page${text ? `?${text}` : ""}`);
        }
        const runs = [];
        for (;;) {
            const after = runs.length > 0 ? `&after=${encodeURIComponent(runs[runs.length - 1].runId)}` : "";
            const page = await this.#transport.request("GET", `/api/runs?limit=${RUNS_PAGE}${after}`);
            runs.push(...page);
            if (page.length < RUNS_PAGE) return runs;
        }
    }

    /** The run's envelope with phases, prompt-safe agent summaries and the latest progress. */
    async getRunDetail(runId) {
        return this.#transport.request("GET", runPath(runId));
    }

    /**
     * A page of the run's progress entries (ascending `seq`): after `afterSeq`, before
     * `beforeSeq`, in phase `phaseId` (a phase's id is its title), at most `limit`; with
     * neither seq, the latest tail.
     */
    async getRunProgress(runId, options = {}) {
        const query = new URLSearchParams();
        const { phaseId, afterSeq, beforeSeq, limit } = options;
        if (phaseId !== undefined && phaseId !== null) query.set("phase", String(phaseId));
        if (afterSeq !== undefined && afterSeq !== null) query.set("afterSeq", String(afterSeq));
        if (beforeSeq !== undefined && beforeSeq !== null) query.set("beforeSeq", String(beforeSeq));
        if (limit !== undefined && limit !== null) query.set("limit", String(limit));
        const text = query.toString();
        return this.#transport.request("GET", runPath(runId, `/progress${text ? `?${text}` : ""}`));
    }

    /** The run's latest envelope. */
    async getRun(runId, options = {}) {
        return this.#transport.request("GET", runPath(runId, "/envelope"), { signal: options.signal });
    }

    /** Cancel the run; its terminal envelope. */
    async cancel(runId) {
        return this.#transport.request("POST", runPath(runId, "/cancel"));
    }

    /** Pause the running run; its `paused` envelope (resume it with `resume`). */
    async pause(runId) {
        return this.#transport.request("POST", runPath(runId, "/pause"));
    }

    /**
     * Delete the ended run and its journal for good: `{ runId, removed: true }`. A run that
     * executes is refused with `already_active` (cancel it first); an unknown one `not_found`.
     */
    async remove(runId) {
        return this.#transport.request("DELETE", runPath(runId));
    }

    /**
     * Delete this session's ended runs (completed, error, cancelled) a retention policy no
     * longer keeps: those last updated more than `keepDays` days ago and not among the
     * newest `keepLast` of their factory (give at least one; `invalid_params` otherwise).
     * With `dryRun`, only list them. Resolves `{ removed: [runId], kept, dryRun }`.
     */
    async gc(options = {}) {
        const { keepDays, keepLast, dryRun } = options;
        const body = { dryRun: dryRun === true };
        if (keepDays !== undefined && keepDays !== null) body.keepDays = keepDays;
        if (keepLast !== undefined && keepLast !== null) body.keepLast = keepLast;
        return this.#transport.request("POST", "/api/gc", { body });
    }

    /**
     * Resolve with the run's terminal envelope once it settles (at once if it has). Follows
     * `factory.run_updated` and re-reads the envelope on each, a burst collapsing into one
     * read in flight (and one after it), plus a slow periodic re-read so a missed event only
     * delays the answer. `signal` aborting rejects the wait with its reason; the run goes on.
     */
    waitForRun(runId, options = {}) {
        const { signal } = options;
        runPath(runId);
        return new Promise((resolveWait, rejectWait) => {
            if (signal?.aborted) {
                rejectWait(signal.reason);
                return;
            }
            const reads = new AbortController();
            let done = false;
            let reading = false;
            let again = false;
            const cleanups = [];
            const finish = (settle, value) => {
                if (done) return;
                done = true;
                for (const cleanup of cleanups) cleanup();
                reads.abort();
                settle(value);
            };
            const read = async () => {
                if (done) return;
                if (reading) {
                    again = true;
                    return;
                }
                reading = true;
                try {
                    do {
                        again = false;
                        const envelope = await this.getRun(runId, { signal: reads.signal });
                        if (isFactoryRunTerminal(envelope?.status)) {
                            finish(resolveWait, envelope);
                            return;
                        }
                    } while (again && !done);
                } catch (e) {
                    // Unreachable for now: the next event or periodic read tries again.
                    if (!done && !(e instanceof FactoryError && e.code === "unavailable")) finish(rejectWait, e);
                } finally {
                    reading = false;
                }
            };
            cleanups.push(this.#events.on(FACTORY_RUN_UPDATED, (event) => event.data.runId === runId && read()));
            cleanups.push(this.#events.onOpen(read));
            const timer = setInterval(read, this.#pollIntervalMs);
            cleanups.push(() => clearInterval(timer));
            if (signal) {
                const onAbort = () => finish(rejectWait, signal.reason);
                signal.addEventListener("abort", onAbort, { once: true });
                cleanups.push(() => signal.removeEventListener("abort", onAbort));
            }
            read();
        });
    }
}

/** A session of the service, as `joinSession` returns it. */
class FactorySession {
    #events;
    #transport;

    constructor(sessionId, transport, events, factories, pollIntervalMs, onPermissionRequest) {
        /** The session's name: its runs and registered factories are its own. */
        this.sessionId = sessionId;
        /** The service's address. */
        this.url = transport.url;
        /** Handles of the factories `joinSession` registered, in the order given. */
        this.factories = factories;
        /** The spec's run, resume and observe API. */
        this.factory = new FactoryApi(transport, events, pollIntervalMs, "factory", onPermissionRequest);
        /** The same API under upstream's workflow names (`WorkflowResumeError`, `workflow_*` codes). */
        this.workflow = new FactoryApi(transport, events, pollIntervalMs, "workflow", onPermissionRequest);
        /** `factories` under the workflow name. */
        this.workflows = factories;
        this.#events = events;
        this.#transport = transport;
    }

    /**
     * Listen for `factory.run_updated` (`{ type, data: { runId, revision }, id, timestamp,
     * ephemeral: true }`), `factory.run_started` (`data: { runId, attempt, factoryName }`) or
     * `factory.run_settled` (`data: { runId, status, consumedCredits, consumedSubagents,
     * elapsedMs, failureType? }`) of this session's runs (also under their `workflow.*`
     * names), or, given only a handler, every event. Returns the function that stops listening.
     */
    on(typeOrHandler, handler) {
        if (typeof typeOrHandler === "function") return this.#events.on("*", typeOrHandler);
        if (typeof typeOrHandler !== "string" || typeof handler !== "function") {
            throw new TypeError("session.on(type, handler) or session.on(handler)");
        }
        return this.#events.on(typeOrHandler, handler);
    }

    /**
     * Stop every listener and the event stream (runs are not affected); later `run` and
     * `resume` calls are refused (`factory_session_disposed` / `workflow_session_disposed`).
     */
    async disconnect() {
        this.#transport.disposed = true;
        this.#events.close();
    }

    async [Symbol.asyncDispose]() {
        await this.disconnect();
    }
}

/**
 * What `factories` entry `entry` registers — a file/directory path, a defineFactory handle's
 * module (`file#name`), or the authoring form — and what the handle names as its source.
 */
function registration(entry) {
    if (entry instanceof URL || (typeof entry === "string" && entry.startsWith("file:"))) {
        const url = new URL(entry);
        if (url.protocol !== "file:") throw new TypeError(`joinSession: a factory URL must be a file: URL, not ${url.protocol}`);
        const path = fileURLToPath(url);
        return { body: { path }, source: path };
    }
    if (typeof entry === "string") {
        const path = resolve(entry);
        return { body: { path }, source: path };
    }
    if (entry && typeof entry.run === "function" && entry.meta) {
        // A handle from a module file: that module, as the one factory of it named so.
        if (typeof entry.module === "string") return { body: { path: `${entry.module}#${entry.meta.name}` }, source: entry.module };
        // Otherwise `run`'s source alone (self-contained, as `factories_manage author` takes it).
        let run = Function.prototype.toString.call(entry.run).trim();
        // A method (`async run(ctx) { ... }`) is not an expression: name it as a function.
        run = run.replace(/^async\s+run\s*\(/, "async function run(").replace(/^run\s*\(/, "function run(");
        return { body: { meta: entry.meta, run }, source: "authored" };
    }
    throw new TypeError("joinSession: each of `factories` is a path, a file: URL or a defineFactory handle");
}

/**
 * Where the store's bytes go, as `factory stats --json` prints it: `{ fileBytes, diskBytes,
 * pageSize, allocatedPages, tables: [{ name, entries, storedBytes, leafPages, branchPages,
 * fragmentedBytes, metadataBytes }], parts: [{ part, bytes, rows }] }` (the parts add up to
 * `fileBytes`), or `null` for a store that does not measure itself. The store
 * covers every session's runs, so this asks as the owner (the token's holder, no session);
 * given `session`, it asks as that session and is refused (FactoryError `bad_request`).
 * Connection: `url`, `token`, `stateDir` (see resolveConnection).
 */
export async function stats(options = {}) {
    const { url, token } = resolveConnection(options);
    const session = options.session ?? null;
    if (session !== null && typeof session !== "string") throw new TypeError("stats: `session` must be a string");
    return new Transport(url, token, session).request("GET", "/api/stats");
}

/**
 * Join a session of the factory service: `session` (a name; default FACTORY_SESSION, as the
 * CLI's, else a fresh `node-<uuid>`), registering `factories` in it — paths or file: URLs of factory files
 * (`.js`, `.ts`, `.py`, `.wasm`, a component directory) and `defineFactory` handles — so
 * `session.factory.run(name)` runs them (`workflows`: the same, under upstream's workflow
 * name, for `session.workflow`). Connection: `url`, `token`, `stateDir` (see
 * resolveConnection); `pollIntervalMs`: waitForRun's periodic re-read (default 5000).
 * `onPermissionRequest(request, { sessionId })`: asked when a run or resume would start a
 * factory this machine does not trust — `request` is `{ kind: "factory", operation ("run" |
 * "resume"), factoryName, approvalKey (its sha256), backend, limits (effective), phases,
 * grants, approvalId }`; resolve `{ kind: "approved" }` (with `always: true` to trust it
 * from now on) to start it, anything else to decline (the call rejects with FactoryError
 * `declined`, nothing started). Without it such a start rejects `no_approval_provider`.
 */
export async function joinSession(options = {}) {
    const { session, pollIntervalMs = DEFAULT_POLL_INTERVAL_MS, onPermissionRequest } = options;
    if (onPermissionRequest !== undefined && typeof onPermissionRequest !== "function") {
        throw new TypeError("joinSession: `onPermissionRequest` must be a function");
    }
    // A session registers factories or workflows (the same thing under upstream's newer name), not both.
    if (options.factories !== undefined && options.workflows !== undefined) {
        throw new TypeError("joinSession: give `factories` or `workflows`, not both");
    }
    const factories = options.workflows ?? options.factories ?? [];
    if (!Array.isArray(factories)) throw new TypeError("joinSession: `factories` (or `workflows`) must be an array");
    const { url, token } = resolveConnection(options);
    const sessionId = session ?? (process.env.FACTORY_SESSION || `node-${randomUUID()}`);
    const transport = new Transport(url, token, sessionId);
    const handles = [];
    for (const entry of factories) {
        const { body, source } = registration(entry);
        const answer = await transport.request("POST", "/api/factories", { body });
        // A file that offers several factories registers each: the answer lists them.
        for (const registered of Array.isArray(answer) ? answer : [answer]) {
            handles.push(
                Object.freeze({
                    name: registered.meta.name,
                    meta: registered.meta,
                    sha256: registered.script?.sha256 ?? registered.hash,
                    source,
                }),
            );
        }
    }
    return new FactorySession(sessionId, transport, new Events(transport), Object.freeze(handles), pollIntervalMs, onPermissionRequest);
}
