// The global scope of a factory in `factory`'s JS runner: ECMAScript 2022 (from TypeScript's
// `lib: ["ES2022"]`) plus the standard Web/Node globals the runner installs (README "Writing
// a factory (JavaScript)"; they arrive with issue 21's standard globals). There is no DOM,
// no `fetch`, no `process`, no `require`: they are not declared, so using them is a type
// error, as it is a run-time error.

export {};

declare global {
    /** Node-style console: `util.format` formatting, lines go to the run's progress log with their level. */
    interface Console {
        log(...data: unknown[]): void;
        info(...data: unknown[]): void;
        warn(...data: unknown[]): void;
        error(...data: unknown[]): void;
        debug(...data: unknown[]): void;
    }
    var console: Console;

    /** Timers run on the host's sleep and count as active time. */
    function setTimeout<A extends unknown[]>(handler: (...args: A) => void, timeout?: number, ...args: A): number;
    function setInterval<A extends unknown[]>(handler: (...args: A) => void, timeout?: number, ...args: A): number;
    function clearTimeout(id: number | undefined): void;
    function clearInterval(id: number | undefined): void;
    function queueMicrotask(callback: () => void): void;

    function structuredClone<T>(value: T): T;
    function atob(data: string): string;
    function btoa(data: string): string;

    interface EventInit {
        bubbles?: boolean;
        cancelable?: boolean;
        composed?: boolean;
    }
    interface Event {
        readonly type: string;
        readonly target: EventTarget | null;
        readonly currentTarget: EventTarget | null;
        readonly bubbles: boolean;
        readonly cancelable: boolean;
        readonly composed: boolean;
        readonly defaultPrevented: boolean;
        readonly isTrusted: boolean;
        readonly timeStamp: number;
        preventDefault(): void;
        stopPropagation(): void;
        stopImmediatePropagation(): void;
    }
    var Event: {
        prototype: Event;
        new (type: string, eventInitDict?: EventInit): Event;
    };

    interface EventListener {
        (event: Event): void;
    }
    interface EventListenerObject {
        handleEvent(event: Event): void;
    }
    type EventListenerOrEventListenerObject = EventListener | EventListenerObject;
    interface AddEventListenerOptions {
        capture?: boolean;
        once?: boolean;
        passive?: boolean;
        signal?: AbortSignal;
    }
    interface EventListenerOptions {
        capture?: boolean;
    }
    interface EventTarget {
        addEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: AddEventListenerOptions | boolean): void;
        removeEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: EventListenerOptions | boolean): void;
        dispatchEvent(event: Event): boolean;
    }
    var EventTarget: {
        prototype: EventTarget;
        new (): EventTarget;
    };

    interface AbortSignal extends EventTarget {
        readonly aborted: boolean;
        readonly reason: unknown;
        onabort: ((this: AbortSignal, event: Event) => void) | null;
        throwIfAborted(): void;
    }
    var AbortSignal: {
        prototype: AbortSignal;
        abort(reason?: unknown): AbortSignal;
        timeout(milliseconds: number): AbortSignal;
        any(signals: readonly AbortSignal[]): AbortSignal;
    };
    interface AbortController {
        readonly signal: AbortSignal;
        abort(reason?: unknown): void;
    }
    var AbortController: {
        prototype: AbortController;
        new (): AbortController;
    };

    interface TextEncoderEncodeIntoResult {
        read: number;
        written: number;
    }
    interface TextEncoder {
        readonly encoding: "utf-8";
        encode(input?: string): Uint8Array;
        encodeInto(source: string, destination: Uint8Array): TextEncoderEncodeIntoResult;
    }
    var TextEncoder: {
        prototype: TextEncoder;
        new (): TextEncoder;
    };
    interface TextDecoderOptions {
        fatal?: boolean;
        ignoreBOM?: boolean;
    }
    interface TextDecodeOptions {
        stream?: boolean;
    }
    interface TextDecoder {
        readonly encoding: string;
        readonly fatal: boolean;
        readonly ignoreBOM: boolean;
        decode(input?: ArrayBuffer | ArrayBufferView, options?: TextDecodeOptions): string;
    }
    var TextDecoder: {
        prototype: TextDecoder;
        new (label?: string, options?: TextDecoderOptions): TextDecoder;
    };

    interface URLSearchParams {
        readonly size: number;
        append(name: string, value: string): void;
        delete(name: string, value?: string): void;
        get(name: string): string | null;
        getAll(name: string): string[];
        has(name: string, value?: string): boolean;
        set(name: string, value: string): void;
        sort(): void;
        toString(): string;
        forEach(callback: (value: string, key: string, parent: URLSearchParams) => void): void;
        entries(): IterableIterator<[string, string]>;
        keys(): IterableIterator<string>;
        values(): IterableIterator<string>;
        [Symbol.iterator](): IterableIterator<[string, string]>;
    }
    var URLSearchParams: {
        prototype: URLSearchParams;
        new (init?: string[][] | Record<string, string> | string | URLSearchParams): URLSearchParams;
    };
    interface URL {
        hash: string;
        host: string;
        hostname: string;
        href: string;
        readonly origin: string;
        password: string;
        pathname: string;
        port: string;
        protocol: string;
        search: string;
        readonly searchParams: URLSearchParams;
        username: string;
        toString(): string;
        toJSON(): string;
    }
    var URL: {
        prototype: URL;
        new (url: string | URL, base?: string | URL): URL;
        canParse(url: string | URL, base?: string | URL): boolean;
    };
}
