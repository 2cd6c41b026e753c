// The factory runtime of the JS runner: `defineFactory`, `joinSession` and the `ctx` API of
// the Copilot SDK's agent factories, on top of the native hooks in `__factory_native`
// (installed by lib.rs) and the standard globals of globals.js (evaluated first). Evaluated
// as a script before the factory's module; the module `"factory"` (alias
// `"@github/copilot-sdk/extension"`) re-exports `__factory_api`.
"use strict";
(() => {
    const MAX_ITEMS = 4096;
    const MAX_DEPTH = 128;
    const FACTORY = Symbol("factory");
    const defined = [];
    let joined = null;

    const G = globalThis.__factory_globals;

    // An abort: the run must stop. A `DOMException` named `AbortError` (as Node's abort
    // reasons are) whose `kind` is the envelope's `failure.type` the run ends with
    // (`cancelled`, `halted`, `paused`, `factory_limit_reached`, `sandbox_limit`, `storage`,
    // `invalid_call`, `backend`) and, for a factory limit, `limit` its `failure.kind`.
    // `parallel`/`pipeline` let it through instead of turning it into `null`.
    class FactoryAbortError extends G.DOMException {
        constructor(kind, message, limit) {
            super(message, "AbortError");
            this.kind = kind;
            if (limit !== undefined) this.limit = limit;
        }
    }
    const isAbort = (e) => e instanceof FactoryAbortError;

    // `kind:message`, or `factory_limit_reached:LIMIT:message` (lib.rs).
    function abortFrom(encoded) {
        const colon = encoded.indexOf(":");
        const kind = encoded.slice(0, colon);
        let rest = encoded.slice(colon + 1);
        if (kind === "factory_limit_reached") {
            const second = rest.indexOf(":");
            return new FactoryAbortError(kind, rest.slice(second + 1), rest.slice(0, second));
        }
        return new FactoryAbortError(kind, rest);
    }

    // Strict JSON: plain objects, arrays, strings, finite numbers, booleans, null.
    function checkJson(value, path, depth, seen) {
        if (depth > MAX_DEPTH) throw new TypeError(`${path} is nested deeper than ${MAX_DEPTH} levels`);
        if (value === null) return;
        switch (typeof value) {
            case "string":
            case "boolean":
                return;
            case "number":
                if (!Number.isFinite(value)) throw new TypeError(`${path} is ${value}, which is not JSON`);
                return;
            case "undefined":
                throw new TypeError(`${path} is undefined, which is not JSON`);
            case "object":
                break;
            default:
                throw new TypeError(`${path} is a ${typeof value}, which is not JSON`);
        }
        if (seen.has(value)) throw new TypeError(`${path} is a circular reference`);
        seen.add(value);
        const array = Array.isArray(value);
        const proto = Object.getPrototypeOf(value);
        if (array ? proto !== Array.prototype : proto !== Object.prototype && proto !== null) {
            const kind = value.constructor && value.constructor.name ? value.constructor.name : "non-plain object";
            throw new TypeError(`${path} is a ${kind}, which is not JSON (convert it to a plain value first)`);
        }
        if (Object.getOwnPropertySymbols(value).length > 0)
            throw new TypeError(`${path} has a symbol-keyed property, which is not JSON`);
        // Plain data only: every own property an enumerable data property (no getters or
        // setters, nothing hidden), and an array nothing but its elements (no holes).
        const names = Object.getOwnPropertyNames(value);
        if (array && names.length !== value.length + 1) {
            for (let i = 0; i < value.length; i++)
                if (!Object.prototype.hasOwnProperty.call(value, i)) throw new TypeError(`${path}[${i}] is a hole in a sparse array, which is not JSON`);
        }
        for (const key of names) {
            if (array && key === "length") continue;
            const at = array ? (/^(0|[1-9][0-9]*)$/.test(key) && Number(key) < value.length ? `${path}[${key}]` : null) : `${path}.${key}`;
            if (at === null) throw new TypeError(`${path} is an array with an extra key \`${key}\`, which is not JSON`);
            const d = Object.getOwnPropertyDescriptor(value, key);
            if (d.get !== undefined || d.set !== undefined)
                throw new TypeError(`${at} is an accessor property (a getter or setter), which is not JSON`);
            if (!d.enumerable) throw new TypeError(`${at} is a non-enumerable property, which is not JSON`);
            checkJson(d.value, at, depth + 1, seen);
        }
        seen.delete(value);
    }
    function toJson(value, path) {
        checkJson(value, path, 0, new Set());
        return JSON.stringify(value);
    }

    function describeError(e) {
        if (e instanceof SyntaxError && typeof e.stack === "string") {
            // `file:line:col: SyntaxError: message`, as compilers report it.
            const at = /^\s*at (?:.*\()?([^()\s]+:\d+:\d+)\)?\s*$/m.exec(e.stack);
            if (at) return `${at[1]}: ${e.name}: ${e.message}`;
        }
        if (e instanceof Error) {
            const head = `${e.name}: ${e.message}`;
            const stack = typeof e.stack === "string" ? e.stack.trimEnd() : "";
            return stack ? `${head}\n${stack}` : head;
        }
        let text;
        try {
            text = String(e);
        } catch {
            text = Object.prototype.toString.call(e);
        }
        return `uncaught ${text}`;
    }

    const AGENT_OPTIONS = ["label", "schema", "model", "agent", "reasoningEffort", "contextTier", "maxTurns", "maxDurationSeconds", "wrapUp"];
    const REASONING_EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh"];

    function checkMeta(meta, who) {
        if (meta === null || typeof meta !== "object") throw new TypeError(`${who}: \`meta\` must be an object`);
        if (typeof meta.name !== "string" || meta.name === "") throw new TypeError(`${who}: \`meta.name\` must be a non-empty string`);
        if (typeof meta.description !== "string") throw new TypeError(`${who}: \`meta.description\` of \`${meta.name}\` must be a string`);
        if (meta.phases !== undefined) {
            if (!Array.isArray(meta.phases)) throw new TypeError(`${who}: \`meta.phases\` must be an array of { title, detail? }`);
            const titles = new Set();
            for (const p of meta.phases) {
                if (p === null || typeof p !== "object" || typeof p.title !== "string")
                    throw new TypeError(`${who}: each of \`meta.phases\` must be { title: string, detail?: string }`);
                if (p.detail !== undefined && typeof p.detail !== "string")
                    throw new TypeError(`${who}: \`meta.phases[].detail\` must be a string`);
                if (p.title.trim() === "") throw new TypeError(`${who}: the phase titles of \`${meta.name}\` must not be empty`);
                if (titles.has(p.title)) throw new TypeError(`${who}: the phase title "${p.title}" of \`${meta.name}\` is declared more than once`);
                titles.add(p.title);
            }
        }
        if (meta.limits !== undefined && (meta.limits === null || typeof meta.limits !== "object"))
            throw new TypeError(`${who}: \`meta.limits\` must be an object`);
        const credits = meta.limits ? meta.limits.maxAiCredits : undefined;
        if (credits !== undefined && credits !== null) {
            const nano = Math.round(credits * 1e9);
            if (typeof credits !== "number" || !Number.isFinite(credits) || credits <= 0 || !Number.isSafeInteger(nano) || nano < 1)
                throw new RangeError(`${who}: \`meta.limits.maxAiCredits\` of \`${meta.name}\` must be a positive, finite number that rounds to a safe positive integer of nano-credits (got ${String(credits)})`);
        }
        if (meta.agentLimits !== undefined && meta.agentLimits !== null) softLimits(meta.agentLimits, `${who}: \`meta.agentLimits\``, false);
    }

    // A deep copy of plain data (objects, arrays), frozen all the way down: the meta a
    // definition keeps cannot change after it was checked.
    function frozenCopy(value) {
        if (value === null || typeof value !== "object") return value;
        const copy = Array.isArray(value) ? value.map(frozenCopy) : {};
        if (!Array.isArray(value)) for (const key of Object.keys(value)) copy[key] = frozenCopy(value[key]);
        return Object.freeze(copy);
    }

    // Per-agent soft limits `{ maxTurns?, maxDurationSeconds?, wrapUp? }` (from `source`,
    // which may hold other keys when `only` is false) checked, as the JSON the runner passes
    // on; null when none is set.
    function softLimits(source, where, only) {
        if (typeof source !== "object") throw new TypeError(`${where} must be an object`);
        const out = {};
        let any = false;
        if (source.maxTurns !== undefined && source.maxTurns !== null) {
            const n = source.maxTurns;
            if (typeof n !== "number" || !Number.isInteger(n) || n < 1 || n > 4294967295)
                throw new RangeError(`${where}: \`maxTurns\` must be a positive integer (got ${String(n)})`);
            out.maxTurns = n;
            any = true;
        }
        if (source.maxDurationSeconds !== undefined && source.maxDurationSeconds !== null) {
            const d = source.maxDurationSeconds;
            if (typeof d !== "number" || !Number.isFinite(d) || d <= 0 || d > 2147483.647)
                throw new RangeError(`${where}: \`maxDurationSeconds\` must be a positive number of seconds, at most 2147483.647 (got ${String(d)})`);
            out.maxDurationSeconds = d;
            any = true;
        }
        if (source.wrapUp !== undefined && source.wrapUp !== null) {
            if (typeof source.wrapUp !== "string" || source.wrapUp.trim() === "")
                throw new TypeError(`${where}: \`wrapUp\` must be a non-empty string`);
            out.wrapUp = source.wrapUp;
            any = true;
        }
        if (only) {
            for (const key of Object.keys(source)) {
                if (key !== "maxTurns" && key !== "maxDurationSeconds" && key !== "wrapUp")
                    throw new TypeError(`${where} has an unknown key \`${key}\` (expected maxTurns, maxDurationSeconds, wrapUp)`);
            }
        }
        return any ? JSON.stringify(out) : null;
    }

    // `defineFactory` and `defineWorkflow` (upstream's current name): the same definition.
    // The handle keeps a deep-frozen copy of `meta`, checked after the copy was taken.
    function define(definition, who) {
        if (definition === null || typeof definition !== "object") throw new TypeError(`${who} takes { meta, run }`);
        if (definition.meta === null || typeof definition.meta !== "object") throw new TypeError(`${who}: \`meta\` must be an object`);
        const meta = frozenCopy(definition.meta);
        checkMeta(meta, who);
        if (typeof definition.run !== "function") throw new TypeError(`${who}: \`run\` of \`${meta.name}\` must be a function`);
        const factory = Object.freeze({ meta, run: definition.run, [FACTORY]: true });
        defined.push(factory);
        return factory;
    }
    const defineFactory = (definition) => define(definition, "defineFactory");
    const defineWorkflow = (definition) => define(definition, "defineWorkflow");

    // Two handles of one registration may not share a name.
    function uniqueNames(handles, where) {
        const names = new Set();
        for (const f of handles) {
            if (names.has(f.meta.name)) throw new TypeError(`${where}: two definitions are named \`${f.meta.name}\`; names must be unique`);
            names.add(f.meta.name);
        }
    }

    // The session a run body sees (`ctx.session`) and `joinSession` resolves to: it cannot
    // start, resume or pause a run from here (as upstream refuses while a body runs), and the
    // sandbox reaches no session to read runs from: those reads say how to make them.
    function sessionApi(kind) {
        const refuse = () =>
            Promise.reject(new Error(`session.${kind}.run, session.${kind}.resume and session.${kind}.pause are not allowed while a ${kind} body is running on this call path.`));
        const unreachable = (method) => () =>
            Promise.reject(new Error(`session.${kind}.${method} is not available inside the factory host's sandbox: read runs with \`factory show\`, \`factory runs\` or the HTTP API`));
        const api = { run: refuse, resume: refuse, pause: refuse };
        for (const method of ["getRun", "listRuns", "getRunDetail", "getRunProgress", "waitForRun", "cancel"]) api[method] = unreachable(method);
        return Object.freeze(api);
    }
    function makeSession(runId) {
        return Object.freeze({
            factories: Object.freeze((joined || []).slice()),
            runId,
            factory: sessionApi("factory"),
            workflow: sessionApi("workflow"),
        });
    }

    // The Copilot SDK's session: here it only records which factories (or workflows) the
    // file offers. As upstream, one call registers factories or workflows, not both.
    function joinSession(options) {
        const factories = options && options.factories;
        const workflows = options && options.workflows;
        if (factories !== undefined && workflows !== undefined)
            throw new TypeError("joinSession: a session registers either `factories` or `workflows`, not both");
        const [given, key] = workflows !== undefined ? [workflows, "workflows"] : [factories, "factories"];
        if (given !== undefined) {
            if (!Array.isArray(given) || !given.every((f) => f && f[FACTORY]))
                throw new TypeError(`joinSession: \`${key}\` must be an array of defineFactory/defineWorkflow results`);
            uniqueNames(given, "joinSession");
            joined = (joined || []).concat(given);
        }
        return Promise.resolve(makeSession(undefined));
    }

    globalThis.__factory_api = Object.freeze({ defineFactory, defineWorkflow, joinSession });

    // Every factory the file offers (its names unique).
    function offeredBy(ns, fileName) {
        const offered = [];
        const add = (f) => {
            if (f && f[FACTORY] && !offered.includes(f)) offered.push(f);
        };
        if (Array.isArray(ns.default)) ns.default.forEach(add);
        else add(ns.default);
        (joined || []).forEach(add);
        for (const key of Object.keys(ns)) if (key !== "default") add(ns[key]);
        const candidates = offered.length ? offered : defined;
        uniqueNames(candidates, fileName);
        return candidates;
    }

    // Which factory the file offers under `entry` (its meta name), or by default.
    function pick(ns, fileName, entry) {
        const candidates = offeredBy(ns, fileName);
        const names = candidates.map((f) => f.meta.name);
        if (entry !== undefined && entry !== null) {
            const found = candidates.find((f) => f.meta.name === entry);
            if (!found)
                throw new Error(`${fileName} has no factory named \`${entry}\`` + (names.length ? ` (it offers: ${names.join(", ")})` : ""));
            return found;
        }
        if (ns.default && ns.default[FACTORY]) return ns.default;
        if (candidates.length === 1) return candidates[0];
        if (candidates.length === 0)
            throw new Error(`${fileName} defines no factory: \`export default defineFactory({ meta, run })\`, or pass it to \`joinSession({ factories: [...] })\``);
        throw new Error(`${fileName} offers several factories (${names.join(", ")}): name one as \`${fileName}#NAME\` (to run, describe or add it)`);
    }

    async function load(fileName, entry) {
        const ns = await import(fileName);
        return pick(ns, fileName, entry);
    }

    globalThis.__factory_describe = async (fileName, entry) => {
        try {
            const factory = await load(fileName, entry);
            const meta = factory.meta;
            const out = { name: meta.name, description: meta.description, phases: meta.phases || [], limits: meta.limits || {} };
            if (meta.agentLimits !== undefined && meta.agentLimits !== null) {
                const soft = softLimits(meta.agentLimits, "meta.agentLimits", true);
                if (soft !== null) out.agentLimits = JSON.parse(soft);
            }
            const schema = meta.argsSchema !== undefined ? meta.argsSchema : meta.args;
            if (schema !== undefined && schema !== null) out.argsSchema = schema;
            return "m" + toJson(out, "meta");
        } catch (e) {
            return "e" + describeError(e);
        }
    };

    // The names of every factory the file offers: `"m" + JSON array`, or `"e" + message`.
    globalThis.__factory_names = async (fileName) => {
        try {
            const names = offeredBy(await import(fileName), fileName).map((f) => f.meta.name);
            if (names.length === 0)
                throw new Error(`${fileName} defines no factory: \`export default defineFactory({ meta, run })\`, or pass it to \`joinSession({ factories: [...] })\``);
            return "m" + JSON.stringify(names);
        } catch (e) {
            return "e" + describeError(e);
        }
    };

    // Agent calls in flight, by the id `native.agentStart` gave (calls.rs): how each
    // settles. lib.rs hands the outcomes that came back to `__factory_settle` in batches.
    const resolvers = [];
    const rejecters = [];
    // A call whose promise a `ctx.parallel` thunk returned: its group and place in it.
    const groups = [];
    const places = [];
    // The promise of the latest call, until a thunk returns it or any call settles.
    let lastCall = null;
    let lastId = -1;
    // How the run learns of an abort (its signal fires); set by makeCtx.
    let fireAbort = () => {};
    let capturedResolve, capturedReject;
    const capture = (resolve, reject) => {
        capturedResolve = resolve;
        capturedReject = reject;
    };

    function startAgent(native, prompt, label, schema, model, limits, tuning) {
        const id = native.agentStart(prompt, label, schema, model, limits, tuning);
        const promise = new Promise(capture);
        resolvers[id] = capturedResolve;
        rejecters[id] = capturedReject;
        lastCall = promise;
        lastId = id;
        return promise;
    }

    // `kinds[i]`: 0 `texts[i]` is the reply's JSON, 1 no reply (null), 2 an abort.
    function settleAgents(ids, kinds, texts) {
        lastCall = null;
        for (let i = 0; i < ids.length; i++) {
            const id = ids[i];
            const resolve = resolvers[id];
            const reject = rejecters[id];
            const group = groups[id];
            const place = places[id];
            resolvers[id] = rejecters[id] = groups[id] = undefined;
            if (resolve === undefined) continue;
            const kind = kinds[i];
            if (kind === 2) {
                const e = abortFrom(texts[i]);
                fireAbort(e);
                if (group !== undefined) group.fail(e);
                reject(e);
                continue;
            }
            let value = null;
            if (kind === 0) {
                try {
                    value = JSON.parse(texts[i]);
                } catch (e) {
                    if (group !== undefined) group.put(place, null);
                    reject(e);
                    continue;
                }
            }
            resolve(value);
            if (group !== undefined) group.put(place, value);
        }
    }
    Object.defineProperty(globalThis, "__factory_settle", { value: settleAgents });

    // A seeded PRNG (mulberry32), so `Math.random()` is the same in every attempt of a run.
    function seededRandom(seedText) {
        let h = 2166136261 >>> 0;
        for (let i = 0; i < seedText.length; i++) h = Math.imul(h ^ seedText.charCodeAt(i), 16777619) >>> 0;
        let a = h;
        return () => {
            a = (a + 0x6d2b79f5) >>> 0;
            let t = a;
            t = Math.imul(t ^ (t >>> 15), t | 1);
            t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
            return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
        };
    }

    // `ctx.signal`: a real AbortSignal, aborted (its `abort` event fired) as soon as the
    // runner learns that the run is stopping: a hook answered with an abort, or the host's
    // stop reason is set (polled when the signal is read, at every host call and timer tick).
    function makeSignal(native) {
        const { signal, abort } = G.runSignal(() => {
            const encoded = native.stopReason();
            return encoded === null || encoded === undefined ? undefined : abortFrom(encoded);
        });
        return { signal, fire: abort };
    }

    function makeCtx(argsJson, runId) {
        const native = globalThis.__factory_native;
        const { signal, fire } = makeSignal(native);
        fireAbort = fire;
        const raise = (encoded) => {
            const e = abortFrom(encoded);
            fire(e);
            throw e;
        };

        // `ctx.sleep(ms)`: the host's sleep (active time); rejects with the abort once the
        // run is stopping.
        async function sleep(ms) {
            const n = Number(ms);
            if (!Number.isFinite(n) || n < 0) throw new TypeError(`ctx.sleep: the delay must be a non-negative number of milliseconds (got ${String(ms)})`);
            signal.throwIfAborted();
            const finished = await G.sleep(Math.trunc(n));
            if (!finished) signal.throwIfAborted();
        }

        // Not an async function (one promise per call, settled with the reply itself); a
        // bad argument rejects as it would from one.
        function agent(prompt, options) {
            let label, schema, model, limits = null, tuning = null;
            try {
                if (typeof prompt !== "string") throw new TypeError("ctx.agent: the prompt must be a string");
                if (options !== undefined && options !== null) {
                    if (typeof options !== "object")
                        throw new TypeError(`ctx.agent: options must be { ${AGENT_OPTIONS.map((k) => k + "?").join(", ")} }`);
                    for (const key of Object.keys(options)) {
                        if (!AGENT_OPTIONS.includes(key))
                            throw new TypeError(`ctx.agent: unknown option \`${key}\` (options are exactly ${AGENT_OPTIONS.join(", ")})`);
                    }
                    limits = softLimits(options, "ctx.agent", false);
                    if (options.label !== undefined && options.label !== null) {
                        if (typeof options.label !== "string") throw new TypeError("ctx.agent: `label` must be a string");
                        label = options.label;
                    }
                    if (options.model !== undefined && options.model !== null) {
                        if (typeof options.model !== "string") throw new TypeError("ctx.agent: `model` must be a string");
                        model = options.model;
                    }
                    if (options.schema !== undefined && options.schema !== null) schema = toJson(options.schema, "ctx.agent: `schema`");
                    // `agent`, `reasoningEffort`, `contextTier`: names, passed on as JSON.
                    const tuned = {};
                    for (const key of ["agent", "reasoningEffort", "contextTier"]) {
                        const v = options[key];
                        if (v === undefined || v === null) continue;
                        if (typeof v !== "string" || v === "") throw new TypeError(`ctx.agent: \`${key}\` must be a non-empty string`);
                        tuned[key] = v;
                    }
                    if (tuned.reasoningEffort !== undefined && !REASONING_EFFORTS.includes(tuned.reasoningEffort))
                        throw new RangeError(`ctx.agent: \`reasoningEffort\` must be one of ${REASONING_EFFORTS.join(", ")} (got ${JSON.stringify(tuned.reasoningEffort)})`);
                    if (Object.keys(tuned).length > 0) tuning = JSON.stringify(tuned);
                }
            } catch (e) {
                return Promise.reject(e);
            }
            return startAgent(native, prompt, label, schema, model, limits, tuning);
        }

        // How many `ctx.parallel`/`ctx.pipeline` calls are in flight: `ctx.pause` is refused
        // meanwhile (a checkpoint belongs to the body's main flow).
        let fanning = 0;
        const fanned = (promise) => {
            fanning++;
            const done = () => {
                fanning--;
            };
            promise.then(done, done);
            return promise;
        };

        // `ctx.pause(key)`: a durable one-shot checkpoint. Its answer once the run was resumed
        // past it (the resume's input, or null); the first time it is reached the run pauses
        // there and this throws the AbortError (kind `paused`) that ends the attempt.
        async function pause(key) {
            if (typeof key !== "string" || key === "") throw new TypeError("ctx.pause: the key must be a non-empty string");
            if (fanning > 0)
                throw new TypeError("ctx.pause: a checkpoint is not allowed inside ctx.parallel or ctx.pipeline; call it from the body's main flow");
            signal.throwIfAborted();
            const answer = native.pause(key);
            if (answer[0] === "a") raise(answer.slice(1));
            return answer === "n" ? null : JSON.parse(answer.slice(1));
        }

        function parallel(thunks) {
            try {
                if (!Array.isArray(thunks)) throw new TypeError("ctx.parallel takes an array of functions");
                if (thunks.length > MAX_ITEMS) throw new RangeError(`ctx.parallel: ${thunks.length} items is more than the ${MAX_ITEMS} allowed`);
                thunks.forEach((t, i) => {
                    if (typeof t !== "function") throw new TypeError(`ctx.parallel: item ${i} is not a function (pass thunks: () => ctx.agent(...))`);
                });
            } catch (e) {
                return Promise.reject(e);
            }
            // Each item's value in place, null for a failure; the first abort rejects. A
            // thunk that returns its `ctx.agent` promise as it is gets the reply put in place
            // when the call settles (no promise reaction per item).
            fanning++;
            const all = new Promise((resolve, reject) => {
                const n = thunks.length;
                const out = new Array(n);
                let left = n;
                let over = false;
                const group = {
                    put(i, value) {
                        if (over) return;
                        out[i] = value;
                        if (--left === 0) {
                            over = true;
                            resolve(out);
                        }
                    },
                    fail(e) {
                        if (over) return;
                        over = true;
                        reject(e);
                    },
                };
                const failed = (i, e) => (isAbort(e) ? group.fail(e) : group.put(i, null));
                if (n === 0) resolve(out);
                for (let i = 0; i < n; i++) {
                    let value;
                    try {
                        lastCall = null;
                        value = thunks[i]();
                    } catch (e) {
                        failed(i, e);
                        continue;
                    }
                    if (value !== null && value === lastCall) {
                        lastCall = null;
                        groups[lastId] = group;
                        places[lastId] = i;
                        continue;
                    }
                    Promise.resolve(value).then(
                        (v) => group.put(i, v),
                        (e) => failed(i, e)
                    );
                }
            });
            fanning--;
            return fanned(all);
        }

        async function pipeline(items, ...stages) {
            if (!Array.isArray(items)) throw new TypeError("ctx.pipeline takes an array of items, then stage functions");
            if (items.length > MAX_ITEMS) throw new RangeError(`ctx.pipeline: ${items.length} items is more than the ${MAX_ITEMS} allowed`);
            stages.forEach((s, i) => {
                if (typeof s !== "function") throw new TypeError(`ctx.pipeline: stage ${i} is not a function`);
            });
            // Counted from before the first stage starts (it starts inside `map`).
            fanning++;
            let all;
            try {
                all = Promise.all(items.map(async (item, index) => {
                    let value = item;
                    try {
                        for (const stage of stages) value = await stage(value, item, index);
                        return value;
                    } catch (e) {
                        if (isAbort(e)) throw e;
                        return null;
                    }
                }));
            } finally {
                fanning--;
            }
            return await fanned(all);
        }

        async function step(key, producer, options) {
            if (typeof key !== "string") throw new TypeError("ctx.step: the key must be a string");
            if (typeof producer !== "function") throw new TypeError("ctx.step: the producer must be a function");
            if (options && options.volatile) return await producer();
            const cached = native.stepGet(key);
            if (cached !== null && cached !== undefined) {
                if (cached[0] === "a") raise(cached.slice(1));
                return JSON.parse(cached.slice(1));
            }
            const value = await producer();
            if (value === undefined) throw new TypeError(`ctx.step("${key}"): the producer returned undefined; a journaled step must produce a JSON value`);
            const text = toJson(value, `ctx.step("${key}") value`);
            const refused = native.stepPut(key, text);
            if (refused !== null && refused !== undefined) {
                if (refused[0] === "a") raise(refused.slice(1));
                throw new TypeError(`ctx.step("${key}"): ${refused.slice(1)}`);
            }
            return JSON.parse(text);
        }

        const ctx = {
            args: JSON.parse(argsJson),
            runId,
            agent,
            parallel,
            pipeline,
            step,
            phase: (title) => {
                G.pollStop();
                native.phase(String(title));
            },
            log: (message) => {
                G.pollStop();
                native.log(String(message));
            },
            sleep,
            pause,
            signal,
            session: makeSession(runId),
            factory: () => Promise.reject(new Error("nested factories are not supported")),
            workflow: () => Promise.reject(new Error("nested workflows are not supported")),
        };
        return Object.freeze(ctx);
    }

    globalThis.__factory_run = async (fileName, entry, argsJson, runId) => {
        try {
            Math.random = seededRandom(runId);
            // An error no one can catch (a throwing timer callback or listener) ends the run,
            // as it ends a Node process.
            const uncaught = new Promise((_, reject) => G.onUncaught(reject));
            const factory = await load(fileName, entry);
            const result = await Promise.race([factory.run(makeCtx(argsJson, runId)), uncaught]);
            if (result === undefined) return "n";
            let json;
            try {
                json = toJson(result, "result");
            } catch (e) {
                return `jthe factory's result is not JSON: ${e.message}; a factory returns plain JSON (objects, arrays, strings, numbers, booleans, null) or undefined`;
            }
            return "r" + json;
        } catch (e) {
            return "e" + describeError(e);
        }
    };
})();
