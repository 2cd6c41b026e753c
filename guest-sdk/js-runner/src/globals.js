// The standard globals of the JS runner's run body, as Node and browsers have them: `console`
// (Node's util.format/inspect, each line to the run's progress log with its level), timers
// and `queueMicrotask` (on the host's `agents.sleep`), `Event`/`EventTarget`/
// `AbortController`/`AbortSignal`/`DOMException`, `TextEncoder`/`TextDecoder` (UTF-8),
// `structuredClone`, `atob`/`btoa`, `URL`/`URLSearchParams` (parsed by the `url` crate in
// lib.rs) and `performance.now()`. Evaluated before prelude.js; what the prelude needs of it
// (a run-owned AbortSignal, the uncaught-error hook, the stop poll) is on the hidden global
// `__factory_globals`. The native hooks (`__factory_native`) are installed after this file
// runs, so every use reads them at call time.
"use strict";
(() => {
    const native = () => globalThis.__factory_native;
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

    const MAX_ARRAY = 100;
    const MAX_STRING = 10000;
    const BREAK = 72;
    const IDENT = /^[A-Za-z_$][\w$]*$/;

    function quote(s) {
        const q = !s.includes("'") ? "'" : !s.includes('"') ? '"' : !s.includes("`") ? "`" : "'";
        let out = "";
        for (const ch of s.length > MAX_STRING ? s.slice(0, MAX_STRING) : s) {
            const c = ch.codePointAt(0);
            if (ch === q || ch === "\\") out += "\\" + ch;
            else if (ch === "\n") out += "\\n";
            else if (ch === "\t") out += "\\t";
            else if (ch === "\r") out += "\\r";
            else if (c < 0x20 || c === 0x7f) out += "\\x" + c.toString(16).toUpperCase().padStart(2, "0");
            else out += ch;
        }
        const more = s.length > MAX_STRING ? `... ${s.length - MAX_STRING} more characters` : "";
        return q + out + q + more;
    }

    function key(k) {
        if (typeof k === "symbol") return `[${k.toString()}]`;
        return IDENT.test(k) ? k : quote(k);
    }

    function errorText(e) {
        let head;
        try {
            head = `${e.name}: ${e.message}`;
            if (e.message === "" || e.message === undefined) head = String(e.name);
        } catch {
            head = "Error";
        }
        const stack = typeof e.stack === "string" ? e.stack.trimEnd() : "";
        if (!stack) return `[${head}]`;
        return stack.startsWith(head) ? stack : `${head}\n${stack}`;
    }

    function fnText(f) {
        let source = "";
        try {
            source = Function.prototype.toString.call(f);
        } catch {
            // A bound or native function.
        }
        if (/^class[\s{]/.test(source)) return f.name ? `[class ${f.name}]` : "[class (anonymous)]";
        const kind = Object.prototype.toString.call(f) === "[object AsyncFunction]" ? "AsyncFunction" : "Function";
        return f.name ? `[${kind}: ${f.name}]` : `[${kind} (anonymous)]`;
    }

    function constructorName(v) {
        let proto = Object.getPrototypeOf(v);
        if (proto === null) return null;
        const ctor = Object.getOwnPropertyDescriptor(proto, "constructor");
        return ctor && typeof ctor.value === "function" && ctor.value.name ? ctor.value.name : "Object";
    }

    // Node's util.inspect for the common cases, with its layout rules (compact 3, break
    // length 80, grouped number arrays): nesting to `depth` (deeper: `[Object]`), cycles as
    // `<ref *1>`/`[Circular *1]`, at most 100 array items.
    function inspect(value, options) {
        const depth = options && options.depth !== undefined ? (options.depth === null ? Infinity : options.depth) : 2;
        const c = { depth, indentationLvl: 0, currentDepth: 0, seen: [], refs: new Map() };
        return formatValue(c, value, 0);
    }

    function formatValue(c, v, level) {
        switch (typeof v) {
            case "string":
                return quote(v);
            case "number":
                return Object.is(v, -0) ? "-0" : String(v);
            case "bigint":
                return `${v}n`;
            case "symbol":
                return v.toString();
            case "undefined":
                return "undefined";
            case "boolean":
                return String(v);
        }
        if (v === null) return "null";
        if (c.seen.includes(v)) {
            if (!c.refs.has(v)) c.refs.set(v, c.refs.size + 1);
            return `[Circular *${c.refs.get(v)}]`;
        }
        return formatRaw(c, v, level);
    }

    function formatRaw(c, v, level) {
        const name = constructorName(v);
        let base = "";
        let braces = ["{", "}"];
        let entries = [];
        let isArrayLike = false;
        let keys = null;
        const prefix = (fallback, size) => `${name === null ? `[${fallback}: null prototype]` : name}${size} `;
        if (typeof v === "function") {
            base = fnText(v);
            keys = ownEnumerable(v);
            if (keys.length === 0) return base;
        } else if (v instanceof Error) {
            base = errorText(v);
            if (c.indentationLvl !== 0) base = base.split("\n").join(`\n${" ".repeat(c.indentationLvl)}`);
            keys = ownEnumerable(v).filter((k) => k !== "stack" && k !== "message");
            if (keys.length === 0) return base;
        } else if (v instanceof Date) {
            return Number.isNaN(v.getTime()) ? "Invalid Date" : v.toISOString();
        } else if (v instanceof RegExp) {
            return String(v);
        } else if (v instanceof Promise) {
            return "Promise { <unknown> }";
        } else if (v instanceof WeakMap || v instanceof WeakSet) {
            return `${name} { <items unknown> }`;
        } else if (v instanceof Number || v instanceof String || v instanceof Boolean) {
            const kind = v instanceof Number ? "Number" : v instanceof String ? "String" : "Boolean";
            return `[${kind}: ${formatValue(c, v.valueOf(), level)}]`;
        } else if (typeof URL === "function" && v instanceof URL) {
            return `URL ${formatValue(c, { ...urlParts(v) }, level)}`;
        }
        if (level > c.depth) {
            if (Array.isArray(v)) return "[Array]";
            return `[${name === null ? "Object: null prototype" : name}]`;
        }
        c.seen.push(v);
        c.currentDepth = level;
        c.indentationLvl += 2;
        const next = (x) => formatValue(c, x, level + 1);
        try {
            if (keys !== null) {
                // A function or an error with own properties.
                entries = keys.map((k) => property(c, v, k, level));
            } else if (Array.isArray(v)) {
                isArrayLike = true;
                braces = [name === "Array" ? "[" : `${prefix("Array", `(${v.length})`)}[`, "]"];
                const shown = Math.min(v.length, MAX_ARRAY);
                let holes = 0;
                for (let i = 0; i < shown; i++) {
                    if (!(i in v)) {
                        holes++;
                        continue;
                    }
                    if (holes) entries.push(`<${holes} empty item${holes > 1 ? "s" : ""}>`);
                    holes = 0;
                    entries.push(next(v[i]));
                }
                if (holes) entries.push(`<${holes} empty item${holes > 1 ? "s" : ""}>`);
                if (v.length > shown) entries.push(`... ${v.length - shown} more item${v.length - shown > 1 ? "s" : ""}`);
                for (const k of ownEnumerable(v)) if (typeof k === "symbol" || !/^\d+$/.test(k)) entries.push(property(c, v, k, level));
            } else if (ArrayBuffer.isView(v) && !(v instanceof DataView)) {
                isArrayLike = true;
                braces = [`${prefix("TypedArray", `(${v.length})`)}[`, "]"];
                const shown = Math.min(v.length, MAX_ARRAY);
                for (let i = 0; i < shown; i++) entries.push(next(v[i]));
                if (v.length > shown) entries.push(`... ${v.length - shown} more item${v.length - shown > 1 ? "s" : ""}`);
            } else if (v instanceof ArrayBuffer) {
                braces = ["ArrayBuffer {", "}"];
                const bytes = [...new Uint8Array(v, 0, Math.min(v.byteLength, 50))].map((b) => b.toString(16).padStart(2, "0"));
                entries.push(`[Uint8Contents]: <${bytes.join(" ")}${v.byteLength > 50 ? ` ... ${v.byteLength - 50} more bytes` : ""}>`);
                entries.push(`byteLength: ${v.byteLength}`);
            } else if (v instanceof Map) {
                braces = [`${prefix("Map", `(${v.size})`)}{`, "}"];
                for (const [k, x] of v) entries.push(`${next(k)} => ${next(x)}`);
                for (const k of ownEnumerable(v)) entries.push(property(c, v, k, level));
            } else if (v instanceof Set) {
                braces = [`${prefix("Set", `(${v.size})`)}{`, "}"];
                for (const x of v) entries.push(next(x));
                for (const k of ownEnumerable(v)) entries.push(property(c, v, k, level));
            } else {
                const tag = v[Symbol.toStringTag];
                if (name === null) braces[0] = "[Object: null prototype] {";
                else if (typeof tag === "string" && tag !== "" && tag !== name) braces[0] = `${name} [${tag}] {`;
                else if (name !== "Object") braces[0] = `${name} {`;
                for (const k of ownEnumerable(v)) entries.push(property(c, v, k, level));
            }
        } finally {
            c.indentationLvl -= 2;
            c.seen.pop();
        }
        let text;
        if (entries.length === 0 && keys === null) text = `${braces[0]}${braces[1]}`;
        else {
            if (isArrayLike && entries.length > 6) entries = groupArrayElements(c, entries, v);
            text = reduceToSingleString(c, entries, base, braces, level, isArrayLike);
        }
        const ref = c.refs.get(v);
        return ref ? `<ref *${ref}> ${text}` : text;
    }

    function ownEnumerable(v) {
        return Reflect.ownKeys(v).filter((k) => {
            const d = Object.getOwnPropertyDescriptor(v, k);
            return d && d.enumerable;
        });
    }

    // `key: value` (the caller has indented the level).
    function property(c, v, k, level) {
        const d = Object.getOwnPropertyDescriptor(v, k);
        let shown;
        if ("value" in d) shown = formatValue(c, d.value, level + 1);
        else shown = d.get && d.set ? "[Getter/Setter]" : d.get ? "[Getter]" : d.set ? "[Setter]" : "undefined";
        return `${key(k)}: ${shown}`;
    }

    function reduceToSingleString(c, output, base, braces, level, isArrayLike) {
        // `currentDepth - level < 3`: at most 3 inner levels share one line (Node's compact: 3).
        if (c.currentDepth - level < 3) {
            const start = output.length + c.indentationLvl + braces[0].length + base.length + 10;
            let total = output.length + start;
            let fits = total + output.length <= 80;
            for (let i = 0; fits && i < output.length; i++) {
                total += output[i].length;
                if (total > 80) fits = false;
            }
            if (fits && (base === "" || !base.includes("\n"))) {
                const joined = output.join(", ");
                if (!joined.includes("\n")) return `${base ? `${base} ` : ""}${braces[0]} ${joined} ${braces[1]}`;
            }
        }
        const indentation = `\n${" ".repeat(c.indentationLvl)}`;
        return `${base ? `${base} ` : ""}${braces[0]}${indentation}  ${output.join(`,${indentation}  `)}${indentation}${braces[1]}`;
    }

    // Node's column layout of long arrays of short items.
    function groupArrayElements(c, output, value) {
        let total = 0;
        let maxLength = 0;
        let outputLength = output.length;
        if (value && value.length > MAX_ARRAY) outputLength--;
        const dataLen = [];
        for (let i = 0; i < outputLength; i++) {
            const len = output[i].length;
            dataLen[i] = len;
            total += len + 2;
            if (maxLength < len) maxLength = len;
        }
        const actualMax = maxLength + 2;
        if (actualMax * 3 + c.indentationLvl < 80 && (total / actualMax > 5 || maxLength <= 6)) {
            const averageBias = Math.sqrt(actualMax - total / output.length);
            const biasedMax = Math.max(actualMax - 3 - averageBias, 1);
            const columns = Math.min(
                Math.round(Math.sqrt(2.5 * biasedMax * outputLength) / biasedMax),
                Math.floor((80 - c.indentationLvl) / actualMax),
                12,
                15
            );
            if (columns <= 1) return output;
            const tmp = [];
            const maxLineLength = [];
            for (let i = 0; i < columns; i++) {
                let lineLength = 0;
                for (let j = i; j < output.length; j += columns) if (dataLen[j] > lineLength) lineLength = dataLen[j];
                maxLineLength.push(lineLength + 2);
            }
            let padStart = true;
            for (let i = 0; i < outputLength; i++) {
                if (typeof value[i] !== "number" && typeof value[i] !== "bigint") {
                    padStart = false;
                    break;
                }
            }
            for (let i = 0; i < outputLength; i += columns) {
                const max = Math.min(i + columns, outputLength);
                let str = "";
                let j = i;
                for (; j < max - 1; j++) {
                    const cell = `${output[j]}, `;
                    str += padStart ? cell.padStart(maxLineLength[j - i], " ") : cell.padEnd(maxLineLength[j - i], " ");
                }
                str += padStart ? output[j].padStart(maxLineLength[j - i] - 2, " ") : output[j];
                tmp.push(str);
            }
            if (outputLength < output.length) tmp.push(output[outputLength]);
            return tmp;
        }
        return output;
    }

    // `%s`: strings as they are, objects without their own toString inspected shallowly.
    function formatS(a) {
        if (typeof a === "bigint") return `${a}n`;
        if (typeof a === "symbol") return a.toString();
        if (typeof a === "number") return Object.is(a, -0) ? "-0" : String(a);
        if (a !== null && typeof a === "object") {
            if (a instanceof Error) return errorText(a);
            const own = (() => {
                for (let o = a; o && o !== Object.prototype && o !== Array.prototype; o = Object.getPrototypeOf(o))
                    if (Object.prototype.hasOwnProperty.call(o, "toString")) return true;
                return false;
            })();
            if (!own) return inspect(a, { depth: 0 });
        }
        return String(a);
    }

    function formatJ(a) {
        try {
            const s = JSON.stringify(a);
            return s === undefined ? "undefined" : s;
        } catch (e) {
            if (e instanceof TypeError && /circular/i.test(e.message)) return "[Circular]";
            throw e;
        }
    }

    // Node's util.format: `%s %d %i %f %j %o %O %c %%` in a leading string, the rest of the
    // arguments inspected (strings as they are), joined by spaces.
    function format(...args) {
        let out = "";
        let next = 0;
        if (typeof args[0] === "string") {
            const f = args[0];
            next = 1;
            let last = 0;
            for (let i = 0; i < f.length - 1; i++) {
                if (f[i] !== "%") continue;
                const c = f[i + 1];
                if (c === "%") {
                    out += f.slice(last, i) + "%";
                    last = i + 2;
                    i++;
                    continue;
                }
                if (!"sdifjoOc".includes(c)) continue;
                if (next >= args.length) continue;
                const a = args[next++];
                let piece;
                switch (c) {
                    case "s":
                        piece = formatS(a);
                        break;
                    case "d":
                        piece = typeof a === "bigint" ? `${a}n` : typeof a === "symbol" ? "NaN" : formatS(Number(a));
                        break;
                    case "i":
                        piece = typeof a === "bigint" ? `${a}n` : typeof a === "symbol" ? "NaN" : formatS(parseInt(a));
                        break;
                    case "f":
                        piece = typeof a === "symbol" ? "NaN" : formatS(parseFloat(a));
                        break;
                    case "j":
                        piece = formatJ(a);
                        break;
                    case "o":
                        piece = inspect(a, { depth: 4 });
                        break;
                    case "O":
                        piece = inspect(a);
                        break;
                    case "c":
                        piece = "";
                        break;
                }
                out += f.slice(last, i) + piece;
                last = i + 2;
                i++;
            }
            out += f.slice(last);
        }
        for (; next < args.length; next++) {
            const a = args[next];
            const piece = typeof a === "string" ? a : inspect(a);
            out += (out === "" && next === 0 ? "" : " ") + piece;
        }
        return out;
    }

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

    // ----------------------------------------------------------------------- TextEncoder, TextDecoder

    function utf8Encode(input) {
        const s = String(input);
        const out = [];
        for (let i = 0; i < s.length; i++) {
            let c = s.charCodeAt(i);
            if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
                const d = s.charCodeAt(i + 1);
                if (d >= 0xdc00 && d <= 0xdfff) {
                    c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
                    i++;
                } else c = 0xfffd;
            } else if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd;
            if (c < 0x80) out.push(c);
            else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
            else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
            else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
        }
        return Uint8Array.from(out);
    }

    class TextEncoder {
        get encoding() {
            return "utf-8";
        }
        encode(input = "") {
            return utf8Encode(input);
        }
        encodeInto(source, destination) {
            if (!(destination instanceof Uint8Array)) throw new TypeError("TextEncoder.encodeInto: the destination must be a Uint8Array");
            const s = String(source);
            let read = 0;
            let written = 0;
            for (const ch of s) {
                const bytes = utf8Encode(ch);
                if (written + bytes.length > destination.length) break;
                destination.set(bytes, written);
                written += bytes.length;
                read += ch.length;
            }
            return { read, written };
        }
    }
    Object.defineProperty(TextEncoder.prototype, Symbol.toStringTag, { value: "TextEncoder", configurable: true });

    const UTF8_LABELS = ["unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8", "x-unicode20utf8"];
    function bytesOf(input) {
        if (input === undefined) return new Uint8Array(0);
        if (input instanceof ArrayBuffer) return new Uint8Array(input);
        if (ArrayBuffer.isView(input)) return new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
        throw new TypeError("TextDecoder.decode: the input must be an ArrayBuffer, a TypedArray or a DataView");
    }
    class TextDecoder {
        constructor(label = "utf-8", options) {
            const name = String(label).trim().toLowerCase();
            if (!UTF8_LABELS.includes(name)) throw new RangeError(`TextDecoder: the encoding '${label}' is not supported (only UTF-8 is)`);
            const o = options || {};
            Object.defineProperty(this, "__s", {
                value: { fatal: !!o.fatal, ignoreBOM: !!o.ignoreBOM, pending: [], bomSeen: false },
            });
        }
        get encoding() {
            return "utf-8";
        }
        get fatal() {
            return this.__s.fatal;
        }
        get ignoreBOM() {
            return this.__s.ignoreBOM;
        }
        // The Encoding Standard's UTF-8 decoder (U+FFFD per maximal invalid subpart).
        decode(input, options) {
            const st = this.__s;
            const stream = !!(options && options.stream);
            const bytes = st.pending.length ? Uint8Array.from([...st.pending, ...bytesOf(input)]) : bytesOf(input);
            st.pending = [];
            let out = "";
            const chunk = [];
            const push = (cp) => {
                chunk.push(cp);
                if (chunk.length >= 4096) {
                    out += String.fromCodePoint(...chunk);
                    chunk.length = 0;
                }
            };
            const bad = () => {
                if (st.fatal) {
                    st.bomSeen = false;
                    throw new TypeError("The encoded data was not valid for encoding utf-8");
                }
                push(0xfffd);
            };
            let cp = 0, needed = 0, seen = 0, lower = 0x80, upper = 0xbf, start = 0;
            for (let i = 0; i < bytes.length; i++) {
                const b = bytes[i];
                if (needed === 0) {
                    start = i;
                    if (b <= 0x7f) push(b);
                    else if (b >= 0xc2 && b <= 0xdf) { needed = 1; cp = b & 0x1f; }
                    else if (b >= 0xe0 && b <= 0xef) {
                        if (b === 0xe0) lower = 0xa0;
                        if (b === 0xed) upper = 0x9f;
                        needed = 2; cp = b & 0xf;
                    } else if (b >= 0xf0 && b <= 0xf4) {
                        if (b === 0xf0) lower = 0x90;
                        if (b === 0xf4) upper = 0x8f;
                        needed = 3; cp = b & 0x7;
                    } else bad();
                    continue;
                }
                if (b < lower || b > upper) {
                    cp = needed = seen = 0; lower = 0x80; upper = 0xbf;
                    bad();
                    i--; // Reprocess this byte.
                    continue;
                }
                lower = 0x80; upper = 0xbf;
                cp = (cp << 6) | (b & 0x3f);
                seen++;
                if (seen === needed) {
                    push(cp);
                    cp = needed = seen = 0;
                }
            }
            if (needed !== 0) {
                if (stream) st.pending = [...bytes.subarray(start)];
                else bad();
            }
            if (chunk.length) out += String.fromCodePoint(...chunk);
            if (!st.ignoreBOM && !st.bomSeen && out.length) {
                if (out.charCodeAt(0) === 0xfeff) out = out.slice(1);
                st.bomSeen = true;
            }
            if (!stream) st.bomSeen = false;
            return out;
        }
    }
    Object.defineProperty(TextDecoder.prototype, Symbol.toStringTag, { value: "TextDecoder", configurable: true });
    define("TextEncoder", TextEncoder);
    define("TextDecoder", TextDecoder);

    // ----------------------------------------------------------------------- structuredClone

    const cloneError = (what) => new DOMException(`${what} could not be cloned.`, "DataCloneError");
    const ERRORS = { Error, EvalError, RangeError, ReferenceError, SyntaxError, TypeError, URIError };
    function structuredClone(value, options) {
        if (options && options.transfer && [...options.transfer].length)
            throw new DOMException("structuredClone: transferring is not supported here", "DataCloneError");
        const memory = new Map();
        const clone = (v) => {
            if (typeof v === "symbol") throw cloneError(v.toString());
            if (typeof v === "function") throw cloneError(fnText(v).replace(/^\[|\]$/g, ""));
            if (v === null || typeof v !== "object") return v;
            if (memory.has(v)) return memory.get(v);
            const tag = Object.prototype.toString.call(v);
            let out;
            if (v instanceof Boolean || v instanceof Number || v instanceof String || (typeof BigInt === "function" && tag === "[object BigInt]")) {
                out = Object(v.valueOf());
                memory.set(v, out);
                return out;
            }
            if (v instanceof Date) out = new Date(v.getTime());
            else if (v instanceof RegExp) out = new RegExp(v.source, v.flags);
            else if (v instanceof ArrayBuffer) out = v.slice(0);
            else if (ArrayBuffer.isView(v)) {
                const buffer = clone(v.buffer);
                out = v instanceof DataView
                    ? new DataView(buffer, v.byteOffset, v.byteLength)
                    : new v.constructor(buffer, v.byteOffset, v.length);
            } else if (v instanceof Map) {
                out = new Map();
                memory.set(v, out);
                for (const [k, x] of v) out.set(clone(k), clone(x));
                return out;
            } else if (v instanceof Set) {
                out = new Set();
                memory.set(v, out);
                for (const x of v) out.add(clone(x));
                return out;
            } else if (v instanceof Error) {
                const name = Object.prototype.hasOwnProperty.call(ERRORS, v.name) ? v.name : "Error";
                out = Object.create(ERRORS[name].prototype);
                memory.set(v, out);
                const d = Object.getOwnPropertyDescriptor(v, "message");
                if (d) Object.defineProperty(out, "message", { value: String(v.message), writable: true, configurable: true });
                if (typeof v.stack === "string") Object.defineProperty(out, "stack", { value: v.stack, writable: true, configurable: true });
                if ("cause" in v) Object.defineProperty(out, "cause", { value: clone(v.cause), writable: true, configurable: true });
                return out;
            } else if (Array.isArray(v)) {
                out = new Array(v.length);
                memory.set(v, out);
                for (const k of Object.keys(v)) out[k] = clone(v[k]);
                return out;
            } else if (
                v instanceof Promise || v instanceof WeakMap || v instanceof WeakSet || v instanceof EventTarget ||
                (typeof WeakRef === "function" && v instanceof WeakRef) || tag === "[object Generator]"
            ) {
                throw cloneError(`#<${constructorName(v) || "Object"}>`);
            } else {
                out = {};
                memory.set(v, out);
                for (const k of Object.keys(v)) out[k] = clone(v[k]);
                return out;
            }
            memory.set(v, out);
            return out;
        };
        if (arguments.length === 0) throw new TypeError("structuredClone: 1 argument required, but only 0 present.");
        return clone(value);
    }
    define("structuredClone", structuredClone);

    // ----------------------------------------------------------------------- atob, btoa

    const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    define("btoa", function btoa(data) {
        if (arguments.length === 0) throw new TypeError("btoa: 1 argument required, but only 0 present.");
        const s = String(data);
        let out = "";
        for (let i = 0; i < s.length; i += 3) {
            const a = s.charCodeAt(i), b = s.charCodeAt(i + 1), c = s.charCodeAt(i + 2);
            for (const x of [a, b, c]) if (x > 255) throw new DOMException("Invalid character", "InvalidCharacterError");
            const n = (a << 16) | ((b || 0) << 8) | (c || 0);
            out += B64[n >> 18] + B64[(n >> 12) & 63] + (i + 1 < s.length ? B64[(n >> 6) & 63] : "=") + (i + 2 < s.length ? B64[n & 63] : "=");
        }
        return out;
    });
    define("atob", function atob(data) {
        if (arguments.length === 0) throw new TypeError("atob: 1 argument required, but only 0 present.");
        let s = String(data).replace(/[\t\n\f\r ]/g, "");
        if (s.length % 4 === 0) s = s.replace(/==?$/, "");
        if (s.length % 4 === 1 || /[^A-Za-z0-9+/]/.test(s)) throw new DOMException("The string to be decoded is not correctly encoded.", "InvalidCharacterError");
        let out = "";
        let bits = 0, n = 0;
        for (const ch of s) {
            n = (n << 6) | B64.indexOf(ch);
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                out += String.fromCharCode((n >> bits) & 255);
            }
        }
        return out;
    });

    // ----------------------------------------------------------------------- URL, URLSearchParams

    const URLS = new WeakMap();
    const urlParts = (u) => {
        const s = URLS.get(u);
        if (!s) throw new TypeError("Illegal invocation: not a URL");
        return s.parts;
    };
    function parseUrl(input, base) {
        const n = native();
        const json = n.urlParse(String(input), base === undefined ? undefined : String(base));
        return json === null || json === undefined ? null : JSON.parse(json);
    }

    // application/x-www-form-urlencoded, by the URL Standard.
    function formDecode(s) {
        const bytes = [];
        const text = s.replace(/\+/g, " ");
        const raw = utf8Encode(text);
        for (let i = 0; i < raw.length; i++) {
            if (raw[i] === 0x25 && i + 2 < raw.length && /^[0-9A-Fa-f]{2}$/.test(String.fromCharCode(raw[i + 1], raw[i + 2]))) {
                bytes.push(parseInt(String.fromCharCode(raw[i + 1], raw[i + 2]), 16));
                i += 2;
            } else bytes.push(raw[i]);
        }
        return new TextDecoder().decode(Uint8Array.from(bytes));
    }
    function formParse(s) {
        const list = [];
        for (const part of s.split("&")) {
            if (part === "") continue;
            const eq = part.indexOf("=");
            const name = eq >= 0 ? part.slice(0, eq) : part;
            const value = eq >= 0 ? part.slice(eq + 1) : "";
            list.push([formDecode(name), formDecode(value)]);
        }
        return list;
    }
    function formEncode(s) {
        let out = "";
        for (const b of utf8Encode(s)) {
            if (b === 0x20) out += "+";
            else if (b === 0x2a || b === 0x2d || b === 0x2e || b === 0x5f || (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5a) || (b >= 0x61 && b <= 0x7a))
                out += String.fromCharCode(b);
            else out += "%" + b.toString(16).toUpperCase().padStart(2, "0");
        }
        return out;
    }
    const usv = (v) => utf8DecodeRoundTrip(String(v));
    const utf8DecodeRoundTrip = (s) => (/[\ud800-\udfff]/.test(s) ? new TextDecoder().decode(utf8Encode(s)) : s);

    const PARAMS = new WeakMap();
    const params = (p) => {
        const s = PARAMS.get(p);
        if (!s) throw new TypeError("Illegal invocation: not a URLSearchParams");
        return s;
    };
    class URLSearchParams {
        constructor(init = "") {
            let list = [];
            if (init instanceof URLSearchParams) list = params(init).list.map(([k, v]) => [k, v]);
            else if (init !== null && typeof init === "object" || typeof init === "function") {
                if (typeof init[Symbol.iterator] === "function") {
                    for (const pair of init) {
                        const p = [...pair];
                        if (p.length !== 2) throw new TypeError("URLSearchParams: each pair must have exactly two items");
                        list.push([usv(p[0]), usv(p[1])]);
                    }
                } else for (const k of Object.keys(init)) list.push([usv(k), usv(init[k])]);
            } else {
                const s = usv(init);
                list = formParse(s.startsWith("?") ? s.slice(1) : s);
            }
            PARAMS.set(this, { list, url: null });
        }
        get size() { return params(this).list.length; }
        append(name, value) {
            params(this).list.push([usv(name), usv(value)]);
            update(this);
        }
        delete(name, value) {
            const s = params(this);
            const n = usv(name);
            s.list = s.list.filter(([k, v]) => !(k === n && (value === undefined || v === usv(value))));
            update(this);
        }
        get(name) {
            const n = usv(name);
            const found = params(this).list.find(([k]) => k === n);
            return found ? found[1] : null;
        }
        getAll(name) {
            const n = usv(name);
            return params(this).list.filter(([k]) => k === n).map(([, v]) => v);
        }
        has(name, value) {
            const n = usv(name);
            return params(this).list.some(([k, v]) => k === n && (value === undefined || v === usv(value)));
        }
        set(name, value) {
            const s = params(this);
            const n = usv(name);
            const i = s.list.findIndex(([k]) => k === n);
            if (i < 0) s.list.push([n, usv(value)]);
            else {
                s.list[i][1] = usv(value);
                s.list = s.list.filter(([k], j) => j <= i || k !== n);
            }
            update(this);
        }
        sort() {
            // Stable, by UTF-16 code units of the names.
            const s = params(this);
            s.list = s.list.map((p, i) => [p, i]).sort((a, b) => (a[0][0] < b[0][0] ? -1 : a[0][0] > b[0][0] ? 1 : a[1] - b[1])).map(([p]) => p);
            update(this);
        }
        forEach(callback, thisArg) {
            if (typeof callback !== "function") throw new TypeError("URLSearchParams.forEach: the callback must be a function");
            const s = params(this);
            for (let i = 0; i < s.list.length; i++) callback.call(thisArg, s.list[i][1], s.list[i][0], this);
        }
        *entries() {
            const s = params(this);
            for (let i = 0; i < s.list.length; i++) yield [s.list[i][0], s.list[i][1]];
        }
        *keys() {
            for (const [k] of this.entries()) yield k;
        }
        *values() {
            for (const [, v] of this.entries()) yield v;
        }
        [Symbol.iterator]() {
            return this.entries();
        }
        toString() {
            return params(this).list.map(([k, v]) => `${formEncode(k)}=${formEncode(v)}`).join("&");
        }
    }
    Object.defineProperty(URLSearchParams.prototype, Symbol.toStringTag, { value: "URLSearchParams", configurable: true });
    // A URL's searchParams changed: write its query back to the URL.
    function update(p) {
        const s = params(p);
        if (!s.url) return;
        const u = URLS.get(s.url);
        u.parts = JSON.parse(native().urlSet(u.parts.href, "search", p.toString()));
    }

    class URL {
        constructor(url, base) {
            if (arguments.length === 0) throw new TypeError("Failed to construct 'URL': 1 argument required, but only 0 present.");
            const parts = parseUrl(url, base);
            if (parts === null) throw new TypeError(`Invalid URL: ${String(url)}${base === undefined ? "" : ` (base ${String(base)})`}`);
            const search = new URLSearchParams(parts.search);
            URLS.set(this, { parts, search });
            params(search).url = this;
        }
        static canParse(url, base) {
            return parseUrl(url, base) !== null;
        }
        static parse(url, base) {
            try {
                return new URL(url, base);
            } catch {
                return null;
            }
        }
        get searchParams() { return URLS.get(this).search; }
        toString() { return urlParts(this).href; }
        toJSON() { return urlParts(this).href; }
        get origin() { return urlParts(this).origin; }
    }
    for (const part of ["href", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"]) {
        Object.defineProperty(URL.prototype, part, {
            configurable: true,
            enumerable: true,
            get() {
                return urlParts(this)[part];
            },
            set(value) {
                const u = URLS.get(this);
                if (!u) throw new TypeError("Illegal invocation: not a URL");
                const next = native().urlSet(u.parts.href, part, usv(value));
                if (next === null || next === undefined) throw new TypeError(`Invalid URL: ${String(value)}`);
                u.parts = JSON.parse(next);
                if (part === "href" || part === "search") params(u.search).list = formParse(u.parts.search.replace(/^\?/, ""));
            },
        });
    }
    Object.defineProperty(URL.prototype, Symbol.toStringTag, { value: "URL", configurable: true });
    define("URL", URL);
    define("URLSearchParams", URLSearchParams);

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
