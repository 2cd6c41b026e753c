// The standard globals of the JS runner's run body, as Node and browsers have them: `console`
// (Node's util.format/inspect, each line to the run's progress log with its level), timers
// and `queueMicrotask` (on the host's `agents.sleep`), `Event`/`EventTarget`/
// `AbortController`/`AbortSignal`/`DOMException`, `TextEncoder`/`TextDecoder` (UTF-8),
// `structuredClone`, `atob`/`btoa`, `URL`/`URLSearchParams` (parsed by the `url` crate in
// lib.rs) and `performance.now()`. Evaluated before prelude.js; what the prelude needs of it
// (a run-owned AbortSignal, the uncaught-error hook, the stop poll) is on the hidden global
// `__factory_globals`. The native hooks (`__factory_native`) are installed after this file
// runs, so every use reads them at call time. `inspect`/`format` (globals-inspect.js) and
// the web globals from `TextEncoder` to `URL` (globals-web.js) are parsed only when a run
// first uses them: parsing this code was most of a run's start-up.
"use strict";
(() => {
    const native = () => globalThis.__factory_native;
    // `evalPart(name)`: evaluate the part `name` of the globals, parsed only when first used
    // (lib.rs; its value is a function of the helpers the part needs).
    const evalPart = globalThis.__factory_parts;
    delete globalThis.__factory_parts;
    const define = (name, value) =>
        Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });

    // ----------------------------------------------------------------------- errors

    // Where an error nobody can catch goes (a throwing timer callback, microtask or event
    // listener): as in Node, it ends the run (prelude.js installs the handler).
    let uncaughtHandler = (e) => {
        throw e;
    };
    const reportUncaught = (e) => uncaughtHandler(e);

    const DOM_CODES = {
        IndexSizeError: 1, HierarchyRequestError: 3, WrongDocumentError: 4, InvalidCharacterError: 5,
        NoModificationAllowedError: 7, NotFoundError: 8, NotSupportedError: 9, InvalidStateError: 11,
        SyntaxError: 12, InvalidModificationError: 13, NamespaceError: 14, InvalidAccessError: 15,
        TypeMismatchError: 17, SecurityError: 18, NetworkError: 19, AbortError: 20, URLMismatchError: 21,
        QuotaExceededError: 22, TimeoutError: 23, InvalidNodeTypeError: 24, DataCloneError: 25,
    };
    class DOMException extends Error {
        constructor(message = "", name = "Error") {
            super(String(message));
            Object.defineProperty(this, "name", { value: String(name), writable: true, configurable: true, enumerable: false });
        }
        get code() {
            return DOM_CODES[this.name] || 0;
        }
    }
    for (const [name, code] of Object.entries(DOM_CODES)) {
        const constant = name.replace(/Error$/, "").replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase() + "_ERR";
        Object.defineProperty(DOMException, constant, { value: code, enumerable: true });
    }
    define("DOMException", DOMException);

    // ----------------------------------------------------------------------- inspect and format

    // `inspect`/`format` (Node's util.inspect/util.format) are in globals-inspect.js, which a
    // run evaluates when it first formats something (see "parsed when first used" below).
    let inspectPart = null;
    const formatting = () =>
        (inspectPart ??= evalPart("inspect")({ urlOf: (v) => (web !== null && v instanceof web.URL ? web.urlParts(v) : null) }));
    const inspect = (v, options) => formatting().inspect(v, options);
    const format = (...args) => formatting().format(...args);
    const fnText = (f) => formatting().fnText(f);
    const constructorName = (v) => formatting().constructorName(v);

    // ----------------------------------------------------------------------- console

    let groupIndent = "";
    const counts = new Map();
    function emit(level, args) {
        let text = format(...args);
        if (groupIndent) text = text.split("\n").map((l) => groupIndent + l).join("\n");
        pollStop();
        const n = native();
        if (n) n.logAt(level, text);
    }
    const consoleObject = {
        log: (...a) => emit("info", a),
        info: (...a) => emit("info", a),
        debug: (...a) => emit("debug", a),
        warn: (...a) => emit("warn", a),
        error: (...a) => emit("error", a),
        trace: (...a) => {
            const stack = (new Error().stack || "").split("\n").slice(1).join("\n");
            emit("error", [`Trace: ${format(...a)}\n${stack}`.trimEnd()]);
        },
        dir: (v, options) => emit("info", [inspect(v, options)]),
        assert: (ok, ...a) => {
            if (!ok) emit("error", a.length ? [`Assertion failed: ${format(...a)}`] : ["Assertion failed"]);
        },
        count: (label = "default") => {
            const n = (counts.get(String(label)) || 0) + 1;
            counts.set(String(label), n);
            emit("info", [`${label}: ${n}`]);
        },
        countReset: (label = "default") => counts.delete(String(label)),
        group: (...a) => {
            if (a.length) emit("info", a);
            groupIndent += "  ";
        },
        groupEnd: () => {
            groupIndent = groupIndent.slice(2);
        },
    };
    consoleObject.groupCollapsed = consoleObject.group;
    define("console", consoleObject);

    // ----------------------------------------------------------------------- the clock

    // `Date.now()` is logical time (lib.rs): the run's creation time plus what its timers
    // have waited. A timer set at logical time t with delay d moves the clock to t + d.
    const clock = () => {
        const n = native();
        return n ? n.clock() : 0;
    };
    const advanceTo = (ms) => {
        const n = native();
        if (n && ms > n.clock()) n.setClock(ms);
    };
    let origin;
    define("performance", Object.freeze({
        now: () => {
            if (origin === undefined) origin = clock();
            return clock() - origin;
        },
        get timeOrigin() {
            if (origin === undefined) origin = clock();
            return origin;
        },
    }));

    // ----------------------------------------------------------------------- timers

    // A timer is one `agents.sleep`; nothing waits for it: the run ends when its body's
    // promise settles, whatever timers are pending. Ids are numbers, as in browsers.
    const timers = new Map();
    let nextTimer = 1;
    const MAX_DELAY = 2147483647;

    function delayOf(ms) {
        const n = Number(ms);
        return Number.isFinite(n) && n >= 1 ? Math.min(Math.trunc(n), MAX_DELAY) : n > MAX_DELAY ? 1 : 0;
    }

    // Sleep `ms` on the host, then advance the logical clock; resolves `false` when the
    // run is stopping (the host then ends sleeps early: no callback should run).
    async function hostSleep(ms) {
        const start = clock();
        const n = native();
        if (!n || !n.sleep) return new Promise(() => {}); // `describe`: timers never fire.
        await n.sleep(ms);
        if (pollStop()) return false;
        advanceTo(start + ms);
        return true;
    }

    function schedule(fn, ms, args, repeat) {
        if (typeof fn !== "function") throw new TypeError(`The "callback" argument must be of type function. Received ${inspect(fn)}`);
        const id = nextTimer++;
        const delay = delayOf(ms);
        const timer = { delay, generation: 0 };
        timers.set(id, timer);
        const arm = () => {
            const generation = ++timer.generation;
            hostSleep(delay).then((fire) => {
                if (!fire || timers.get(id) !== timer || timer.generation !== generation) return;
                if (!repeat) timers.delete(id);
                try {
                    fn(...args);
                } catch (e) {
                    reportUncaught(e);
                }
                if (repeat && timers.get(id) === timer) arm();
            });
        };
        arm();
        return id;
    }
    const clear = (id) => {
        timers.delete(typeof id === "object" && id !== null ? Number(id) : id);
    };
    define("setTimeout", (fn, ms, ...args) => schedule(fn, ms, args, false));
    define("setInterval", (fn, ms, ...args) => schedule(fn, ms, args, true));
    define("clearTimeout", clear);
    define("clearInterval", clear);
    define("queueMicrotask", (fn) => {
        if (typeof fn !== "function") throw new TypeError(`The "callback" argument must be of type function. Received ${inspect(fn)}`);
        Promise.resolve().then(() => {
            try {
                fn();
            } catch (e) {
                reportUncaught(e);
            }
        });
    });

    // ----------------------------------------------------------------------- Event, EventTarget

    const EV = new WeakMap();
    const ev = (e) => {
        const s = EV.get(e);
        if (!s) throw new TypeError("Illegal invocation: not an Event");
        return s;
    };
    class Event {
        constructor(type, init) {
            if (arguments.length === 0) throw new TypeError("Failed to construct 'Event': 1 argument required, but only 0 present.");
            const o = init === undefined || init === null ? {} : init;
            if (typeof o !== "object") throw new TypeError("Failed to construct 'Event': The provided value is not of type 'EventInit'.");
            EV.set(this, {
                type: String(type),
                bubbles: !!o.bubbles,
                cancelable: !!o.cancelable,
                composed: !!o.composed,
                target: null,
                currentTarget: null,
                phase: 0,
                canceled: false,
                stop: false,
                stopNow: false,
                passive: false,
                dispatching: false,
                timeStamp: performance.now(),
            });
        }
        get type() { return ev(this).type; }
        get target() { return ev(this).target; }
        get srcElement() { return ev(this).target; }
        get currentTarget() { return ev(this).currentTarget; }
        get eventPhase() { return ev(this).phase; }
        get bubbles() { return ev(this).bubbles; }
        get cancelable() { return ev(this).cancelable; }
        get composed() { return ev(this).composed; }
        get defaultPrevented() { return ev(this).canceled; }
        get returnValue() { return !ev(this).canceled; }
        get isTrusted() { return !!ev(this).trusted; }
        get timeStamp() { return ev(this).timeStamp; }
        get cancelBubble() { return ev(this).stop; }
        set cancelBubble(v) { if (v) ev(this).stop = true; }
        composedPath() {
            const s = ev(this);
            return s.dispatching && s.currentTarget ? [s.currentTarget] : [];
        }
        preventDefault() {
            const s = ev(this);
            if (s.cancelable && !s.passive) s.canceled = true;
        }
        stopPropagation() { ev(this).stop = true; }
        stopImmediatePropagation() {
            const s = ev(this);
            s.stop = true;
            s.stopNow = true;
        }
    }
    for (const [name, value] of [["NONE", 0], ["CAPTURING_PHASE", 1], ["AT_TARGET", 2], ["BUBBLING_PHASE", 3]]) {
        Object.defineProperty(Event, name, { value, enumerable: true });
        Object.defineProperty(Event.prototype, name, { value, enumerable: true });
    }
    Object.defineProperty(Event.prototype, Symbol.toStringTag, { value: "Event", configurable: true });

    const LISTENERS = new WeakMap();
    const listenersOf = (t) => {
        let m = LISTENERS.get(t);
        if (!m) {
            m = new Map();
            LISTENERS.set(t, m);
        }
        return m;
    };
    function flatten(options) {
        if (typeof options === "boolean") return { capture: options };
        if (options === null || options === undefined || typeof options !== "object") return { capture: false };
        return { capture: !!options.capture, once: !!options.once, passive: options.passive === undefined ? undefined : !!options.passive, signal: options.signal };
    }
    class EventTarget {
        constructor() {
            listenersOf(this);
        }
        addEventListener(type, callback, options) {
            const o = flatten(options);
            if (o.signal !== undefined && !(o.signal instanceof AbortSignal))
                throw new TypeError("Failed to execute 'addEventListener': member signal is not of type AbortSignal.");
            if (callback === null || callback === undefined) return;
            if (typeof callback !== "function" && typeof callback !== "object")
                throw new TypeError("Failed to execute 'addEventListener': parameter 2 is not of type 'Object'.");
            if (o.signal && o.signal.aborted) return;
            const all = listenersOf(this);
            const name = String(type);
            const list = all.get(name) || [];
            if (list.some((l) => l.callback === callback && l.capture === o.capture)) return;
            const entry = { callback, capture: o.capture, once: !!o.once, passive: !!o.passive, removed: false };
            list.push(entry);
            all.set(name, list);
            if (o.signal) o.signal.addEventListener("abort", () => this.removeEventListener(name, callback, { capture: o.capture }));
        }
        removeEventListener(type, callback, options) {
            const capture = flatten(options).capture;
            const all = listenersOf(this);
            const list = all.get(String(type));
            if (!list) return;
            const i = list.findIndex((l) => l.callback === callback && l.capture === capture);
            if (i >= 0) {
                list[i].removed = true;
                list.splice(i, 1);
            }
        }
        dispatchEvent(event) {
            if (!(event instanceof Event)) throw new TypeError("Failed to execute 'dispatchEvent': parameter 1 is not of type 'Event'.");
            const s = ev(event);
            if (s.dispatching) throw new DOMException("The event is already being dispatched.", "InvalidStateError");
            s.dispatching = true;
            s.target = this;
            s.currentTarget = this;
            s.phase = 2;
            try {
                const list = (listenersOf(this).get(s.type) || []).slice();
                for (const l of list) {
                    if (l.removed) continue;
                    if (l.once) this.removeEventListener(s.type, l.callback, { capture: l.capture });
                    s.passive = l.passive;
                    try {
                        if (typeof l.callback === "function") l.callback.call(this, event);
                        else if (typeof l.callback.handleEvent === "function") l.callback.handleEvent(event);
                    } catch (e) {
                        reportUncaught(e);
                    }
                    s.passive = false;
                    if (s.stopNow) break;
                }
            } finally {
                s.dispatching = false;
                s.currentTarget = null;
                s.phase = 0;
                s.stop = false;
                s.stopNow = false;
            }
            return !s.canceled;
        }
    }
    Object.defineProperty(EventTarget.prototype, Symbol.toStringTag, { value: "EventTarget", configurable: true });

    // `onabort`-style handler attributes: a listener kept in place that calls the current value.
    function handlerAttribute(proto, type) {
        const HANDLERS = new WeakMap();
        Object.defineProperty(proto, `on${type}`, {
            configurable: true,
            enumerable: true,
            get() {
                const h = HANDLERS.get(this);
                return h ? h.value : null;
            },
            set(value) {
                const fn = typeof value === "function" || (value !== null && typeof value === "object") ? value : null;
                let h = HANDLERS.get(this);
                if (fn === null) {
                    if (h) {
                        this.removeEventListener(type, h.listener);
                        HANDLERS.delete(this);
                    }
                    return;
                }
                if (!h) {
                    h = { value: fn, listener: null };
                    h.listener = function (event) {
                        return typeof h.value === "function" ? h.value.call(this, event) : undefined;
                    };
                    HANDLERS.set(this, h);
                    this.addEventListener(type, h.listener);
                } else h.value = fn;
            },
        });
    }

    // ----------------------------------------------------------------------- AbortSignal

    const SIG = new WeakMap();
    const sig = (s) => {
        const state = SIG.get(s);
        if (!state) throw new TypeError("Illegal invocation: not an AbortSignal");
        return state;
    };
    let constructing = false;
    class AbortSignal extends EventTarget {
        constructor() {
            if (!constructing) throw new TypeError("Illegal constructor");
            super();
            SIG.set(this, { aborted: false, reason: undefined, dependents: [], poll: null });
        }
        get aborted() {
            const s = sig(this);
            if (!s.aborted && s.poll) s.poll();
            return s.aborted;
        }
        get reason() {
            const s = sig(this);
            if (!s.aborted && s.poll) s.poll();
            return s.reason;
        }
        throwIfAborted() {
            if (this.aborted) throw sig(this).reason;
        }
        static abort(reason) {
            const signal = newSignal();
            abortSignal(signal, reason === undefined ? new DOMException("This operation was aborted", "AbortError") : reason);
            return signal;
        }
        static timeout(ms) {
            const n = Number(ms);
            if (!Number.isFinite(n) || n < 0 || n > Number.MAX_SAFE_INTEGER)
                throw new TypeError(`AbortSignal.timeout: the delay must be a non-negative integer (got ${String(ms)})`);
            const signal = newSignal();
            hostSleep(Math.trunc(n)).then((fire) => {
                if (fire) abortSignal(signal, new DOMException("The operation was aborted due to timeout", "TimeoutError"));
            });
            return signal;
        }
        static any(signals) {
            const list = [...signals];
            for (const s of list) if (!(s instanceof AbortSignal)) throw new TypeError("AbortSignal.any: every item must be an AbortSignal");
            const result = newSignal();
            for (const s of list) {
                if (s.aborted) {
                    sig(result).aborted = true;
                    sig(result).reason = s.reason;
                    return result;
                }
            }
            for (const s of list) sig(s).dependents.push(result);
            return result;
        }
    }
    handlerAttribute(AbortSignal.prototype, "abort");
    Object.defineProperty(AbortSignal.prototype, Symbol.toStringTag, { value: "AbortSignal", configurable: true });

    function newSignal() {
        constructing = true;
        try {
            return new AbortSignal();
        } finally {
            constructing = false;
        }
    }

    // The spec's "signal abort": set the reason of it and its dependents, then fire `abort`
    // on it and then on each dependent.
    function abortSignal(signal, reason) {
        const s = sig(signal);
        if (s.aborted) return;
        s.aborted = true;
        s.reason = reason === undefined ? new DOMException("This operation was aborted", "AbortError") : reason;
        const dependents = [];
        for (const d of s.dependents) {
            const ds = sig(d);
            if (!ds.aborted) {
                ds.aborted = true;
                ds.reason = s.reason;
                dependents.push(d);
            }
        }
        s.dependents = [];
        signal.dispatchEvent(trusted("abort"));
        for (const d of dependents) d.dispatchEvent(trusted("abort"));
    }

    // An event the runtime fires itself (`isTrusted`, as in browsers and Node).
    function trusted(type) {
        const event = new Event(type);
        ev(event).trusted = true;
        return event;
    }

    class AbortController {
        constructor() {
            Object.defineProperty(this, "__signal", { value: newSignal() });
        }
        get signal() {
            return this.__signal;
        }
        abort(reason) {
            abortSignal(this.__signal, reason);
        }
    }
    Object.defineProperty(AbortController.prototype, Symbol.toStringTag, { value: "AbortController", configurable: true });

    define("Event", Event);
    define("EventTarget", EventTarget);
    define("AbortSignal", AbortSignal);
    define("AbortController", AbortController);

    // The run's own signal (`ctx.signal`): `poll` is asked whenever it is read, and on every
    // host call and timer tick (pollStop).
    let runSignal = null;
    let runPoll = null;
    function pollStop() {
        if (runPoll) runPoll();
        return runSignal !== null && sig(runSignal).aborted;
    }

    // ----------------------------------------------------------------------- parsed when first used

    // `TextEncoder`/`TextDecoder`, `structuredClone`, `atob`/`btoa`, `URL`/`URLSearchParams`
    // are in globals-web.js, which a run evaluates when it first reads one of them: parsing
    // is most of a run's start-up, and few runs use these. Until then they are accessor
    // properties of `globalThis` (like Node's lazily loaded globals); the first read makes
    // them all plain writable properties, and an assignment replaces one as it would a
    // plain property.
    const WEB = ["TextEncoder", "TextDecoder", "structuredClone", "atob", "btoa", "URL", "URLSearchParams"];
    const webGetters = new Map();
    let web = null;
    function loadWeb() {
        if (web === null) {
            web = evalPart("web")({ DOMException, EventTarget, constructorName, fnText, native });
            for (const name of WEB) {
                const d = Object.getOwnPropertyDescriptor(globalThis, name);
                if (d && d.get === webGetters.get(name)) define(name, web[name]);
            }
        }
        return web;
    }
    for (const name of WEB) {
        const get = () => loadWeb()[name];
        webGetters.set(name, get);
        Object.defineProperty(globalThis, name, {
            get,
            set: (value) => define(name, value),
            configurable: true,
            enumerable: false,
        });
    }
    const urlParts = (u) => loadWeb().urlParts(u);

    // ----------------------------------------------------------------------- for prelude.js

    Object.defineProperty(globalThis, "__factory_globals", {
        value: Object.freeze({
            DOMException,
            format,
            inspect,
            sleep: hostSleep,
            pollStop,
            onUncaught: (handler) => {
                uncaughtHandler = handler;
            },
            // The run's signal: `poll()` answers an abort reason or undefined.
            runSignal: (poll) => {
                const signal = newSignal();
                runSignal = signal;
                runPoll = () => {
                    if (sig(signal).aborted) return;
                    const reason = poll();
                    if (reason !== undefined) abortSignal(signal, reason);
                };
                sig(signal).poll = runPoll;
                return { signal, abort: (reason) => abortSignal(signal, reason) };
            },
        }),
    });
})();
