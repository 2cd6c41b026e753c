// The globals conformance checks of tests/js_globals.rs: run unchanged in real Node
// (run-node.mjs) and as a factory run by the JS runner; the two results must be equal. No
// clock or randomness, so both runs compute the same JSON.
async function checks() {
    const out = {};
    // AbortController / AbortSignal / Event / EventTarget
    const c = new AbortController();
    const seen = [];
    c.signal.addEventListener("abort", (e) => seen.push(`listener:${e.type}:${e.target === c.signal}:${e.isTrusted}`));
    c.signal.onabort = (e) => seen.push(`onabort:${e.type}`);
    c.signal.addEventListener("abort", () => seen.push("once"), { once: true });
    out.beforeAbort = [c.signal.aborted, c.signal.reason === undefined];
    c.abort();
    c.abort("second");
    out.afterAbort = { aborted: c.signal.aborted, reasonName: c.signal.reason.name, reasonIsDOMException: c.signal.reason instanceof DOMException, code: c.signal.reason.code, message: c.signal.reason.message, seen };
    try { c.signal.throwIfAborted(); } catch (e) { out.thrown = e === c.signal.reason; }
    const custom = new AbortController();
    custom.abort({ why: 1 });
    out.customReason = custom.signal.reason;
    out.staticAbort = [AbortSignal.abort().aborted, AbortSignal.abort(7).reason];
    const t = AbortSignal.timeout(20);
    out.timeoutBefore = t.aborted;
    await new Promise((resolve) => t.addEventListener("abort", resolve));
    out.timeout = { aborted: t.aborted, name: t.reason.name, code: t.reason.code };
    const a = new AbortController(), b = new AbortController();
    const any = AbortSignal.any([a.signal, b.signal]);
    const anySeen = [];
    any.addEventListener("abort", () => anySeen.push(`any:${any.reason}:${b.signal.aborted}`));
    b.abort("b-reason");
    a.abort("a-reason");
    out.any = { aborted: any.aborted, reason: any.reason, anySeen, already: AbortSignal.any([AbortSignal.abort("x")]).reason };
    try { new AbortSignal(); out.illegal = "constructed"; } catch (e) { out.illegal = e.constructor.name; }
    const target = new EventTarget();
    const order = [];
    const l1 = () => order.push(1);
    target.addEventListener("ping", l1);
    target.addEventListener("ping", l1);
    target.addEventListener("ping", { handleEvent: (e) => order.push(`obj:${e.type}`) });
    target.addEventListener("ping", (e) => { order.push("stop"); e.stopImmediatePropagation(); });
    target.addEventListener("ping", () => order.push("never"));
        target.addEventListener("ping", (e) => e.preventDefault());
    out.dispatch = [target.dispatchEvent(new Event("ping")), order.slice()];
    target.removeEventListener("ping", l1);
    order.length = 0;
    const signalled = new AbortController();
    target.addEventListener("pong", () => order.push("pong"), { signal: signalled.signal });
    target.dispatchEvent(new Event("pong"));
    signalled.abort();
    target.dispatchEvent(new Event("pong"));
    out.signalRemoves = order.slice();
    const pd = new EventTarget();
    pd.addEventListener("x", (e) => e.preventDefault());
    const ev = new Event("x", { cancelable: true });
    out.preventDefault = [pd.dispatchEvent(ev), ev.defaultPrevented, new Event("y").bubbles, Event.AT_TARGET];

    // TextEncoder / TextDecoder
    const text = "héllo, 世界 🎉";
    const bytes = new TextEncoder().encode(text);
    out.encoded = Array.from(bytes);
    out.roundTrip = new TextDecoder().decode(bytes) === text;
    out.decodedLength = new TextDecoder("utf8").decode(bytes.buffer).length;
    out.lone = Array.from(new TextEncoder().encode("a\ud800b"));
    out.invalid = new TextDecoder().decode(new Uint8Array([0x61, 0xff, 0xe2, 0x82, 0x62, 0xf0, 0x9f, 0x98]));
    try { new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array([0xc3])); out.fatal = "decoded"; } catch (e) { out.fatal = e.constructor.name; }
    const streaming = new TextDecoder();
    out.stream = streaming.decode(new Uint8Array([0xe4, 0xb8]), { stream: true }) + "|" + streaming.decode(new Uint8Array([0x96, 0x41]));
    out.bom = [new TextDecoder().decode(new Uint8Array([0xef, 0xbb, 0xbf, 0x41])), new TextDecoder("utf-8", { ignoreBOM: true }).decode(new Uint8Array([0xef, 0xbb, 0xbf, 0x41])).length];
    const into = new Uint8Array(5);
    out.encodeInto = [new TextEncoder().encodeInto("a世b", into), Array.from(into)];

    // structuredClone
    const nested = { a: [1, { b: "two" }], m: new Map([["k", new Set([1, 2])]]), d: new Date(86400000), r: /x+/gi, u: new Uint8Array([1, 2, 3]), n: null, und: undefined };
    nested.self = nested;
    const copy = structuredClone(nested);
    out.clone = {
        distinct: copy !== nested && copy.a !== nested.a && copy.a[1] !== nested.a[1],
        cycle: copy.self === copy,
        a: copy.a,
        map: [...copy.m.get("k")],
        date: copy.d.toISOString(),
        regexp: [copy.r.source, copy.r.flags],
        bytes: Array.from(copy.u),
        keys: Object.keys(copy),
        hasUndefined: "und" in copy,
        error: (() => { const e = structuredClone(new RangeError("bad", { cause: 1 })); return [e instanceof RangeError, e.message, e.cause]; })(),
        classInstance: (() => { class P { constructor() { this.x = 1; } } const p = structuredClone(new P()); return [p.constructor === Object, p.x]; })(),
    };
    try { structuredClone({ f() {} }); out.cloneFunction = "cloned"; } catch (e) { out.cloneFunction = [e.name, e instanceof DOMException, e.code]; }
    try { structuredClone(Symbol("s")); out.cloneSymbol = "cloned"; } catch (e) { out.cloneSymbol = e.name; }

    // atob / btoa
    out.btoa = [btoa("hello"), btoa(""), btoa("a"), btoa("ab"), btoa("\xff\xfe")];
    out.atob = [atob("aGVsbG8="), atob("aGVsbG8"), atob(" YW Jj "), atob("//4=").charCodeAt(0)];
    try { btoa("世"); out.btoaWide = "encoded"; } catch (e) { out.btoaWide = [e.name, e.code]; }
    try { atob("a"); out.atobBad = "decoded"; } catch (e) { out.atobBad = e.name; }

    // URL / URLSearchParams
    const u = new URL("../c/d?x=1&y=two+words#frag", "https://user:pw@Example.COM:8080/a/b/index.html");
    out.url = { href: u.href, origin: u.origin, protocol: u.protocol, username: u.username, password: u.password, host: u.host, hostname: u.hostname, port: u.port, pathname: u.pathname, search: u.search, hash: u.hash, y: u.searchParams.get("y"), json: JSON.stringify({ u }) };
    u.searchParams.append("z", "é & ü");
    u.searchParams.delete("x");
    out.urlAfterParams = u.href;
    u.pathname = "/new path";
    u.hash = "";
    u.port = "443";
    u.protocol = "http";
    out.urlAfterSetters = u.href;
    u.search = "?q=1";
    out.searchFollows = [u.searchParams.get("q"), u.searchParams.has("z")];
    out.special = [new URL("HTTP://[::1]:80/").href, new URL("file:///tmp/x y").pathname, new URL("https://münchen.de/").hostname, new URL("mailto:a@b.c").pathname, new URL("https://a.b/%7Efoo/./../bar").pathname];
    try { new URL("not a url"); out.invalidUrl = "parsed"; } catch (e) { out.invalidUrl = e.constructor.name; }
    out.canParse = [URL.canParse("https://x"), URL.canParse("/rel"), URL.canParse("/rel", "https://x")];
    const p = new URLSearchParams("?a=1&b=2&a=3&c=%20x+y&d");
    out.params = { a: p.getAll("a"), c: p.get("c"), d: p.get("d"), missing: p.get("zz"), size: p.size, has: [p.has("a", "3"), p.has("a", "9")] };
    p.set("a", "only");
    p.sort();
    out.paramsString = p.toString();
    out.paramsFrom = [new URLSearchParams({ k: "v w", "ü": "~*" }).toString(), new URLSearchParams([["x", "1"], ["x", "2"]]).toString(), [...new URLSearchParams("a=1&b=2").keys()]];

    // queueMicrotask runs before timers, after the current job.
    const ticks = [];
    setTimeout(() => ticks.push("timeout"), 0);
    queueMicrotask(() => ticks.push("microtask"));
    ticks.push("sync");
    await new Promise((resolve) => setTimeout(resolve, 5));
    out.ticks = ticks;
    const cleared = [];
    const id = setTimeout(() => cleared.push("cleared timer ran"), 1);
    clearTimeout(id);
    let n = 0;
    await new Promise((resolve) => {
        const iv = setInterval((arg) => {
            n++;
            if (n === 3) {
                clearInterval(iv);
                resolve();
            }
        }, 1, "arg");
    });
    await new Promise((resolve) => setTimeout(resolve, 5));
    out.timers = { cleared, intervals: n };
    return out;
}
