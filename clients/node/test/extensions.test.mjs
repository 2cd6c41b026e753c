// Extensions in the spec's form (extensions/*.mjs: only their import line is this package's)
// whose `run` uses its module's scope — a helper and a constant beside it, a local module it
// imports — registered by loading them as an extension is loaded, and run by the real service:
// a defineFactory handle registers its module, so the sandbox evaluates the module and `run`
// sees what it closes over. The same `run` sent alone (a plain `{ meta, run }`, the authoring
// form) fails with a ReferenceError: what module registration is for.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import { joinSession } from "../index.js";
import { startService } from "./helpers.mjs";

let service;
before(async () => {
    service = await startService();
    process.env.FACTORY_URL = service.url;
    process.env.FACTORY_TOKEN = service.token;
});
after(async () => {
    await service?.stop();
});

/** Load extension `file` in session `name` (its `joinSession()` reads FACTORY_SESSION), then join that session. */
async function loadExtension(file, name) {
    process.env.FACTORY_SESSION = name;
    await import(`./extensions/${file}`);
    const session = await joinSession();
    delete process.env.FACTORY_SESSION;
    return session;
}

test("a run calls a helper and reads a constant of its module", async () => {
    const session = await loadExtension("with-helper.mjs", `helper-${process.pid}`);
    const run = await session.factory.run("review-with-helper", { args: { files: ["a.ts", "b.ts"] } });
    assert.equal(run.status, "completed", JSON.stringify(run));
    assert.deepEqual(run.result, { labels: ["Review a.ts", "Review b.ts"], reviews: ["looks fine", "looks fine"] });
    assert.deepEqual(session.factories, [], "this program registered nothing itself");
    await session.disconnect();
});

test("a run uses a local module its module imports (which imports another)", async () => {
    const session = await loadExtension("imports-local.mjs", `local-${process.pid}`);
    const run = await session.factory.run("planned-review", { args: { files: ["c.ts", "a.ts", "b.ts"] } });
    assert.equal(run.status, "completed", JSON.stringify(run));
    assert.deepEqual(run.result, { reviewed: { "a.ts": "looks fine", "b.ts": "looks fine" } });
    const logs = (await session.factory.getRunProgress(run.runId, { phaseId: "Plan" })).filter((e) => e.event === "log");
    assert.deepEqual(logs.map((e) => e.message), ["dropped 1: c.ts"]);
    await session.disconnect();
});

test("the same run sent as source alone (the authoring form) cannot see its module: a ReferenceError", async () => {
    const REVIEW = "Review ";
    const reviewLabel = (file) => `${REVIEW}${file}`;
    const plain = {
        meta: { name: "review-without-module", description: "args: { files: string[] }" },
        run: async (ctx) => ({ labels: ctx.args.files.map(reviewLabel) }),
    };
    const session = await joinSession({ factories: [plain] });
    assert.deepEqual(session.factories.map((f) => f.source), ["authored"]);
    const run = await session.factory.run(plain, { args: { files: ["a.ts"] } });
    assert.equal(run.status, "error", JSON.stringify(run));
    assert.match(JSON.stringify(run.failure ?? run.error), /ReferenceError|reviewLabel is not defined/);
    await session.disconnect();
});

test("a module the sandbox cannot load is refused at registration, naming why", async () => {
    // This test file imports node:test: a handle defined here would register this file, and
    // the sandbox refuses a Node built-in by name.
    const { defineFactory } = await import("../index.js");
    const here = defineFactory({ meta: { name: "defined-in-a-test", description: "" }, run: async () => 1 });
    assert.equal(here.module, fileURLToPath(import.meta.url));
    await assert.rejects(joinSession({ factories: [here] }), (e) => /node:test|built-in/i.test(e.message));
});

test("a file that offers several factories, registered by path, registers each", async () => {
    const file = fileURLToPath(new URL("./extensions/two-factories.mjs", import.meta.url));
    const session = await joinSession({ session: `two-${process.pid}`, factories: [file] });
    assert.deepEqual(session.factories.map((f) => [f.name, f.source]), [["first-of-two", file], ["second-of-two", file]]);
    for (const [name, which] of [["first-of-two", "first"], ["second-of-two", "second"]]) {
        const run = await session.factory.run(name);
        assert.deepEqual([run.status, run.result], ["completed", { which }], JSON.stringify(run));
    }
    await session.disconnect();
});
