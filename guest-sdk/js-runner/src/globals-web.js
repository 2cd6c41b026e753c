// The standard globals of the JS runner that a run parses only when it first reads one of
// them (globals.js defines them as lazy properties of `globalThis`): `TextEncoder`/
// `TextDecoder` (UTF-8), `structuredClone`, `atob`/`btoa` and `URL`/`URLSearchParams`
// (parsed by the `url` crate in lib.rs). Evaluated as a script whose value is a function of
// the helpers of globals.js it needs; it returns the globals by name.
"use strict";
(({ DOMException, EventTarget, constructorName, fnText, native }) => {
    const globals = {};
    const define = (name, value) => {
        globals[name] = value;
    };

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

    globals.urlParts = urlParts;
    return globals;
})
