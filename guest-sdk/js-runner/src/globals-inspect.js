// Node's `util.inspect` and `util.format` for the JS runner's globals (`console`, error
// messages), evaluated when a run first formats something (globals.js): parsing is most of
// a run's start-up. A script whose value is a function of what it needs of globals.js
// (`urlOf(v)`: the parts of a `URL`, or null); it returns the functions by name.
"use strict";
(({ urlOf }) => {

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
        } else if (urlOf(v) !== null) {
            return `URL ${formatValue(c, { ...urlOf(v) }, level)}`;
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

    return { inspect, format, fnText, constructorName };
})
