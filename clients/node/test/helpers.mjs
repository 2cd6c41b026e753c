// Test support: a real `factory serve --http 127.0.0.1:0` on a temporary state directory
// whose default backend is a script backend (fast `t:` agents, slow `slow:` ones, `hang:`
// ones that take minutes, `Review ` ones that cost 2 AI credits each; anything else dry-run).

import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync, readFileSync, existsSync, rmSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const here = dirname(fileURLToPath(import.meta.url));

/** The repository's root. */
export const root = join(here, "..", "..", "..");

/** The `factory` binary under test: $FACTORY_BIN (tests/node_client.rs sets it), else target/debug/factory. */
export function factoryBin() {
    const bin = process.env.FACTORY_BIN ?? join(root, "target", "debug", "factory");
    if (!existsSync(bin)) {
        throw new Error(`no factory binary at ${bin}: build it (cargo build -p factory-host --bin factory) or set FACTORY_BIN`);
    }
    return bin;
}

const RULES = {
    rules: [
        { labelPrefix: "t:", reply: { text: "ok" }, latencyMs: 1 },
        { labelPrefix: "slow:", reply: { text: "ok" }, latencyMs: 1500 },
        { labelPrefix: "hang:", reply: { text: "late" }, latencyMs: 600000 },
        { labelPrefix: "Review ", reply: { text: "looks fine" }, usage: { inputTokens: 10, outputTokens: 5, credits: 2 } },
    ],
    fallback: "dry-run",
};

/** Start a service; resolves with `{ url, token, stateDir, stop }` once it serves HTTP. */
export async function startService() {
    const stateDir = mkdtempSync(join(tmpdir(), "factory-node-client-"));
    const home = join(stateDir, "home");
    mkdirSync(home);
    writeFileSync(join(stateDir, "rules.json"), JSON.stringify(RULES));
    writeFileSync(
        join(stateDir, "factory.toml"),
        `default = "test"\n[backends.test]\nkind = "script"\npath = ${JSON.stringify(join(stateDir, "rules.json"))}\n`,
    );
    const env = { ...process.env, FACTORY_STATE_DIR: stateDir, HOME: home, FACTORY_NO_DAEMON: "1" };
    for (const name of ["FACTORY_CONFIG", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "FACTORY_URL", "FACTORY_TOKEN", "FACTORY_SESSION"]) {
        delete env[name];
    }
    const child = spawn(factoryBin(), ["serve", "--http", "127.0.0.1:0"], { env, stdio: ["ignore", "ignore", "pipe"] });
    const lines = [];
    const url = await new Promise((resolveUrl, reject) => {
        const reader = createInterface({ input: child.stderr });
        reader.on("line", (line) => {
            lines.push(line);
            const match = line.match(/HTTP API on (http:\/\/[^/]+)\/api\//);
            if (match) resolveUrl(match[1]);
        });
        child.on("exit", (code) => reject(new Error(`factory serve exited (${code}) before serving:\n${lines.join("\n")}`)));
        child.on("error", reject);
    });
    const token = readFileSync(join(stateDir, "http.token"), "utf8").trim();
    const stop = async () => {
        if (child.exitCode === null) {
            const exited = new Promise((done) => child.on("exit", done));
            child.kill("SIGTERM");
            await exited;
        }
        rmSync(stateDir, { recursive: true, force: true });
    };
    return { url, token, stateDir, stop, log: lines, env };
}

/** Poll `check` (sync or async) until it returns a truthy value; fail after `seconds`. */
export async function until(check, what, seconds = 60) {
    const deadline = Date.now() + seconds * 1000;
    for (;;) {
        const value = await check();
        if (value) return value;
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
        await new Promise((done) => setTimeout(done, 50));
    }
}

/** The test factory file. */
export const FANOUT = new URL("./factories/fanout.js", import.meta.url);

/** Run the `factory` CLI against `service` (its state directory); its stdout. */
export function factoryCli(service, args) {
    return execFileSync(factoryBin(), args, { env: service.env, encoding: "utf8" });
}
