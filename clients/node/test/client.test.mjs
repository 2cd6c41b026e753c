// The Node client against a real `factory serve --http` (started here on a temporary state
// directory, see helpers.mjs): run, resume with a raised limit, listRuns order and session
// isolation, progress paging, waitForRun with an AbortSignal, cancel, run_updated revisions,
// FactoryResumeError codes, the authoring form, and where the connection comes from.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { fileURLToPath } from "node:url";
import {
    joinSession,
    defineFactory,
    isFactoryRunTerminal,
    resolveConnection,
    stats,
    FactoryError,
    FactoryResumeError,
    FACTORY_RESUME_ERROR_CODES,
    FACTORY_RUN_UPDATED,
    FACTORY_RUN_STARTED,
    FACTORY_RUN_SETTLED,
    FACTORY_RUN_COMPLETED,
    FACTORY_PHASE_LOGGED,
    defineWorkflow,
    isWorkflowRunTerminal,
    WorkflowResumeError,
    WORKFLOW_RESUME_ERROR_CODES,
} from "../index.js";
import { startService, until, FANOUT, factoryCli } from "./helpers.mjs";
import { echo, wfEcho, capped } from "./extensions/definitions.mjs";

/** The module the test's defineFactory handles come from (they register it as `file#name`). */
const DEFINITIONS_PATH = fileURLToPath(new URL("./extensions/definitions.mjs", import.meta.url));

let service;
before(async () => {
    service = await startService();
});
after(async () => {
    await service?.stop();
});

/** A fresh session of the service with the test factory registered in it. */
function join(extra = {}) {
    return joinSession({ url: service.url, token: service.token, factories: [FANOUT], ...extra });
}

/** The id of the session's first run that is `running` (polled until there is one). */
async function runningRun(session) {
    const run = await until(async () => (await session.factory.listRuns()).find((r) => r.status === "running"), "a running run");
    return run.runId;
}

test("run resolves with the terminal envelope, by handle or by name, in the session", async () => {
    const session = await join();
    assert.match(session.sessionId, /^node-[0-9a-f-]{36}$/);
    assert.deepEqual(session.factories.map((f) => f.name), ["fanout"]);
    assert.match(session.factories[0].sha256, /^[0-9a-f]{64}$/);

    const byHandle = await session.factory.run(session.factories[0], { args: { n: 3 } });
    assert.equal(byHandle.status, "completed", JSON.stringify(byHandle));
    assert.deepEqual(byHandle.result, { done: 3 });
    assert.equal(byHandle.session, session.sessionId);
    assert.equal(byHandle.factory, "fanout");
    assert.ok(isFactoryRunTerminal(byHandle.status));

    const byName = await session.factory.run("fanout", { args: { n: 2 }, limits: { maxConcurrentSubagents: 1 } });
    assert.deepEqual([byName.status, byName.result], ["completed", { done: 2 }]);
    assert.notEqual(byName.runId, byHandle.runId);
    // getRun reads the same durable envelope.
    assert.deepEqual(await session.factory.getRun(byName.runId), byName);

    // Only a failure before a run exists rejects.
    await assert.rejects(session.factory.run("no-such-factory"), (e) => e instanceof FactoryError && e.code === "unknown_factory");
    await assert.rejects(
        session.factory.run("fanout", { limits: { maxTotalSubagents: 0 } }),
        (e) => e instanceof FactoryError && e.code === "invalid_limits",
    );
    await session.disconnect();
});

test("resume with a raised limit completes a run that hit maxTotalSubagents", async () => {
    const session = await join();
    const stopped = await session.factory.run("fanout", { args: { n: 4 }, limits: { maxTotalSubagents: 2 } });
    assert.equal(stopped.status, "error", JSON.stringify(stopped));
    assert.equal(stopped.failure.type, "factory_limit_reached");
    assert.equal(stopped.failure.kind, "maxTotalSubagents");
    assert.equal(stopped.result, undefined);

    const resumed = await session.factory.resume(stopped.runId, { limits: { maxTotalSubagents: 10 } });
    assert.equal(resumed.runId, stopped.runId);
    assert.equal(resumed.status, "completed", JSON.stringify(resumed));
    assert.deepEqual(resumed.result, { done: 4 });
    assert.equal(resumed.attempts, 2);
    assert.ok(resumed.revision > stopped.revision);
    // Resuming it again: it completed.
    await assert.rejects(
        session.factory.resume(stopped.runId),
        (e) => e instanceof FactoryResumeError && e.code === "non_resumable" && e instanceof FactoryError,
    );
    await session.disconnect();
});

test("FactoryResumeError carries the spec's codes", async () => {
    assert.deepEqual(FACTORY_RESUME_ERROR_CODES, [
        "not_found",
        "non_resumable",
        "already_active",
        "factory_already_running",
        "factory_limits_invalid",
        "factory_session_disposed",
        "factory_storage_unavailable",
        "factory_storage_corrupt",
    ]);
    const session = await join();
    await assert.rejects(session.factory.resume("no-such-run"), (e) => {
        assert.ok(e instanceof FactoryResumeError, String(e));
        assert.equal(e.name, "FactoryResumeError");
        assert.equal(e.code, "not_found");
        return true;
    });
    const pending = session.factory.run("fanout", { args: { n: 1, prefix: "hang:" } });
    const runId = await runningRun(session);
    await assert.rejects(session.factory.resume(runId), (e) => e instanceof FactoryResumeError && e.code === "already_active");
    // Another session cannot see the run at all.
    const other = await join();
    await assert.rejects(other.factory.resume(runId), (e) => e instanceof FactoryResumeError && e.code === "not_found");
    assert.equal((await session.factory.cancel(runId)).status, "cancelled");
    assert.equal((await pending).status, "cancelled");
    await session.disconnect();
    await other.disconnect();
});

test("listRuns({ afterSeq, beforeSeq, limit }) pages by creation sequence: newest first, then older and newer", async () => {
    const session = await join();
    const ids = [];
    for (const n of [1, 2, 1]) ids.push((await session.factory.run("fanout", { args: { n } })).runId);
    // Without options: still the whole array.
    assert.ok(Array.isArray(await session.factory.listRuns()));
    const ofPage = (page) => page.runs.map((r) => r.runId);

    const newest = await session.factory.listRuns({ limit: 1 });
    assert.deepEqual(ofPage(newest), [ids[2]]);
    assert.equal(newest.oldestSeq, newest.runs[0].seq);
    assert.equal(newest.newestSeq, newest.runs[0].seq);
    assert.deepEqual([newest.hasMoreNewer, newest.omittedOlder], [false, true]);

    // Walk older with beforeSeq = the page's oldestSeq.
    const middle = await session.factory.listRuns({ beforeSeq: newest.oldestSeq, limit: 1 });
    assert.deepEqual(ofPage(middle), [ids[1]]);
    assert.deepEqual([middle.hasMoreNewer, middle.omittedOlder], [true, true]);
    const oldest = await session.factory.listRuns({ beforeSeq: middle.oldestSeq, limit: 1 });
    assert.deepEqual(ofPage(oldest), [ids[0]]);
    assert.deepEqual([oldest.hasMoreNewer, oldest.omittedOlder], [true, false]);
    const none = await session.factory.listRuns({ beforeSeq: oldest.oldestSeq, limit: 1 });
    assert.deepEqual([ofPage(none), none.oldestSeq, none.newestSeq, none.hasMoreNewer, none.omittedOlder], [[], null, null, true, false]);

    // Walk newer with afterSeq = the page's newestSeq.
    const second = await session.factory.listRuns({ afterSeq: oldest.newestSeq, limit: 1 });
    assert.deepEqual(ofPage(second), [ids[1]]);
    assert.deepEqual([second.hasMoreNewer, second.omittedOlder], [true, true]);
    const third = await session.factory.listRuns({ afterSeq: second.newestSeq, limit: 1 });
    assert.deepEqual(ofPage(third), [ids[2]]);
    assert.deepEqual([third.hasMoreNewer, third.omittedOlder], [false, true]);

    // The default page (limit 200) holds all three, oldest first, seqs increasing.
    const all = await session.factory.listRuns({});
    assert.deepEqual(ofPage(all), ids);
    assert.ok(all.runs[0].seq < all.runs[1].seq && all.runs[1].seq < all.runs[2].seq);
    assert.deepEqual([all.hasMoreNewer, all.omittedOlder], [false, false]);
    // Another session's page holds none of them.
    const other = await join({ session: `paging-${process.pid}`, factories: [] });
    assert.deepEqual(ofPage(await other.factory.listRuns({ limit: 5 })), []);
    await assert.rejects(session.factory.listRuns({ limit: 0 }), TypeError);
    await session.disconnect();
    await other.disconnect();
});

test("listRuns lists the session's runs in creation order; other sessions see none of them", async () => {
    const session = await join();
    const ids = [];
    for (const n of [1, 2, 1]) ids.push((await session.factory.run("fanout", { args: { n } })).runId);
    const runs = await session.factory.listRuns();
    assert.deepEqual(runs.map((r) => r.runId), ids);
    assert.ok(runs.every((r) => r.session === session.sessionId && r.status === "completed"));
    for (let i = 1; i < runs.length; i++) assert.ok(runs[i - 1].createdAt <= runs[i].createdAt);

    const other = await join({ session: `other-${process.pid}` });
    assert.equal(other.sessionId, `other-${process.pid}`);
    assert.deepEqual(await other.factory.listRuns(), []);
    for (const read of [
        () => other.factory.getRun(ids[0]),
        () => other.factory.getRunDetail(ids[0]),
        () => other.factory.getRunProgress(ids[0]),
        () => other.factory.cancel(ids[0]),
        () => other.factory.waitForRun(ids[0]),
    ]) {
        await assert.rejects(read(), (e) => e instanceof FactoryError && e.code === "not_found");
    }
    // The same name joins the same session.
    const again = await join({ session: other.sessionId, factories: [] });
    const own = await again.factory.run("fanout", { args: { n: 1 } });
    assert.deepEqual((await other.factory.listRuns()).map((r) => r.runId), [own.runId]);
    await session.disconnect();
});

test("gc: a session collects its own ended runs by a retention policy, never another session's", async () => {
    const session = await join();
    const other = await join();
    const mine = [];
    for (const n of [1, 1]) mine.push((await session.factory.run("fanout", { args: { n } })).runId);
    const theirs = (await other.factory.run("fanout", { args: { n: 1 } })).runId;
    await assert.rejects(session.factory.gc({}), (e) => e instanceof FactoryError && e.code === "invalid_params" && e.httpStatus === 400);
    // The newest of the factory is kept; a dry run only says which would go.
    assert.deepEqual(await session.factory.gc({ keepLast: 1, dryRun: true }), { removed: [mine[0]], kept: 2, dryRun: true });
    assert.deepEqual((await session.factory.listRuns()).map((r) => r.runId), mine);
    assert.deepEqual(await session.factory.gc({ keepDays: 0 }), { removed: mine, kept: 0, dryRun: false });
    assert.deepEqual(await session.factory.listRuns(), []);
    await assert.rejects(session.factory.getRun(mine[0]), (e) => e instanceof FactoryError && e.code === "not_found");
    assert.equal((await other.factory.getRun(theirs)).status, "completed", "another session's run stays");
    await session.disconnect();
    await other.disconnect();
});

test("stats: the owner reads where the store's bytes go, the parts adding up to the file; a session is refused", async () => {
    const owner = { url: service.url, token: service.token };
    const session = await join();
    const journal = (report) => report.parts.find((p) => p.part.startsWith("journal values"));
    const runs = (report) => report.tables.find((t) => t.name === "runs");
    await session.factory.run("fanout", { args: { n: 1 } });
    const before = await stats(owner);
    assert.ok(before.fileBytes > 0 && before.pageSize > 0, JSON.stringify(before));
    assert.equal(before.parts.reduce((sum, p) => sum + p.bytes, 0), before.fileBytes, "the parts add up to the file");
    assert.ok(journal(before).bytes > 0 && journal(before).rows > 0, JSON.stringify(before.parts));
    // One more run of three agents: one more run record, three more agent replies at least.
    await session.factory.run("fanout", { args: { n: 3 } });
    const after = await stats(owner);
    assert.equal(runs(after).entries, runs(before).entries + 1, JSON.stringify(after.tables));
    assert.ok(journal(after).rows >= journal(before).rows + 3, JSON.stringify(after.parts));
    assert.equal(after.parts.reduce((sum, p) => sum + p.bytes, 0), after.fileBytes);
    // The store covers every session's runs: a session asking is refused, typed.
    await assert.rejects(
        stats({ ...owner, session: session.sessionId }),
        (e) => e instanceof FactoryError && e.code === "bad_request" && e.httpStatus === 400,
    );
    await assert.rejects(stats({ ...owner, token: "0".repeat(64) }), (e) => e instanceof FactoryError && e.code === "unauthorized" && e.httpStatus === 401);
    await session.disconnect();
});

test("getRunProgress pages forwards, backwards, by phase and from the tail; getRunDetail", async () => {
    const session = await join();
    const run = await session.factory.run("fanout", { args: { n: 2, logs: 12 } });
    assert.equal(run.status, "completed");
    const all = await session.factory.getRunProgress(run.runId, { afterSeq: 0, limit: 1000 });
    assert.ok(all.length > 14, `${all.length} entries`);
    all.forEach((entry, i) => assert.equal(entry.seq, i + 1));
    const { getRunProgress } = session.factory;

    const first = await session.factory.getRunProgress(run.runId, { afterSeq: 0, limit: 5 });
    assert.deepEqual(first, all.slice(0, 5));
    const second = await session.factory.getRunProgress(run.runId, { afterSeq: first.at(-1).seq, limit: 5 });
    assert.deepEqual(second, all.slice(5, 10));
    const back = await session.factory.getRunProgress(run.runId, { beforeSeq: all[5].seq, limit: 3 });
    assert.deepEqual(back, all.slice(2, 5));
    const tail = await session.factory.getRunProgress(run.runId, { limit: 4 });
    assert.deepEqual(tail, all.slice(-4));
    assert.equal(typeof getRunProgress, "function");

    const logPhase = await session.factory.getRunProgress(run.runId, { phaseId: "Log", afterSeq: 0, limit: 1000 });
    assert.deepEqual(logPhase, all.filter((e) => e.phase === "Log"));
    const lines = logPhase.filter((e) => e.event === "log").map((e) => e.message);
    assert.deepEqual(lines, Array.from({ length: 12 }, (_, i) => `line ${i}`));
    const logPage = await session.factory.getRunProgress(run.runId, { phaseId: "Log", afterSeq: logPhase[5].seq, limit: 3 });
    assert.deepEqual(logPage, logPhase.slice(6, 9));
    assert.ok((await session.factory.getRunProgress(run.runId, { phaseId: "No such phase" })).length === 0);
    await assert.rejects(
        session.factory.getRunProgress(run.runId, { afterSeq: -1 }),
        (e) => e instanceof FactoryError && e.code === "invalid_params",
    );

    const detail = await session.factory.getRunDetail(run.runId);
    assert.equal(detail.runId, run.runId);
    assert.equal(detail.status, "completed");
    assert.deepEqual(detail.phases, ["Fan out", "Log"]);
    assert.deepEqual(detail.agents.map((a) => a.label).sort(), ["t:0", "t:1"]);
    assert.deepEqual(detail.progress, all.slice(-detail.progress.length));
    assert.ok(!JSON.stringify(detail).includes("item 0"), "no prompt in the detail");
    await session.disconnect();
});

test("waitForRun: an abort rejects the wait with its reason and leaves the run going", async () => {
    const session = await join();
    const pending = session.factory.run("fanout", { args: { n: 1, prefix: "hang:" } });
    const runId = await runningRun(session);

    const controller = new AbortController();
    const wait = session.factory.waitForRun(runId, { signal: controller.signal });
    controller.abort();
    await assert.rejects(wait, (e) => e.name === "AbortError");
    const reason = new Error("stop waiting");
    const second = new AbortController();
    const wait2 = session.factory.waitForRun(runId, { signal: second.signal });
    second.abort(reason);
    await assert.rejects(wait2, (e) => e === reason);
    await assert.rejects(session.factory.waitForRun(runId, { signal: AbortSignal.abort() }), (e) => e.name === "AbortError");

    // The run is untouched by all that: still running, and a later wait still sees it end.
    assert.equal((await session.factory.getRun(runId)).status, "running");
    // Deleting a run that executes is refused, and the run goes on.
    await assert.rejects(session.factory.remove(runId), (e) => e instanceof FactoryError && e.code === "already_active" && e.httpStatus === 409);
    assert.equal((await session.factory.getRun(runId)).status, "running");
    const settled = session.factory.waitForRun(runId);
    const cancelled = await session.factory.cancel(runId);
    assert.equal(cancelled.status, "cancelled");
    assert.ok(isFactoryRunTerminal(cancelled.status));
    assert.equal(cancelled.failure?.type, "cancelled");
    assert.deepEqual(await settled, cancelled);
    assert.deepEqual(await pending, cancelled);
    // A settled run resolves at once, and a terminal envelope never changes.
    assert.deepEqual(await session.factory.waitForRun(runId), cancelled);
    // Ended, it is deleted with its journal: then unknown.
    assert.deepEqual(await session.factory.remove(runId), { runId, removed: true });
    await assert.rejects(session.factory.getRun(runId), (e) => e instanceof FactoryError && e.code === "not_found");
    await assert.rejects(session.factory.remove(runId), (e) => e instanceof FactoryError && e.code === "not_found");
    await session.disconnect();
});

test("pause: a running run settles paused, waitForRun settles on it, a second pause is not_running", async () => {
    const session = await join();
    const pending = session.factory.run("fanout", { args: { n: 1, prefix: "hang:" } });
    const runId = await runningRun(session);
    const settled = session.factory.waitForRun(runId);
    const paused = await session.factory.pause(runId);
    assert.equal(paused.status, "paused");
    assert.ok(isFactoryRunTerminal(paused.status));
    assert.deepEqual([paused.failure?.type, paused.failure?.kind], ["paused", "caller"]);
    assert.deepEqual(await settled, paused);
    assert.deepEqual(await pending, paused);
    await assert.rejects(session.factory.pause(runId), (e) => e.code === "not_running" && e.httpStatus === 409);
    // An answer is for a run that waits at a checkpoint; this one waits at none.
    await assert.rejects(session.factory.resume(runId, { input: { approved: true } }), (e) => e.code === "not_at_checkpoint");
    await session.disconnect();
});

test("waitForRun: aborting the wait does not stop a run that then completes", async () => {
    const session = await join();
    const pending = session.factory.run("fanout", { args: { n: 2, prefix: "slow:" } });
    const runId = await runningRun(session);
    const controller = new AbortController();
    const wait = session.factory.waitForRun(runId, { signal: controller.signal });
    controller.abort();
    await assert.rejects(wait, (e) => e.name === "AbortError");
    const done = await pending;
    assert.equal(done.runId, runId);
    assert.deepEqual([done.status, done.result], ["completed", { done: 2 }]);
    await session.disconnect();
});

test("factory.run_started / factory.run_settled: every attempt, with what it consumed", async () => {
    const session = await join();
    const [started, settled, workflowSettled, updates] = [[], [], [], []];
    const offs = [
        session.on(FACTORY_RUN_STARTED, (event) => started.push(event)),
        session.on(FACTORY_RUN_SETTLED, (event) => settled.push(event)),
        session.on("workflow.run_settled", (event) => workflowSettled.push(event)),
        session.on(FACTORY_RUN_UPDATED, (event) => updates.push(event)),
    ];
    // The stream is open once a first run's updates arrive; attempts are told from then on.
    const first = await session.factory.run("fanout", { args: { n: 1 } });
    await until(() => updates.some((e) => e.data.runId === first.runId && e.data.revision >= first.revision), "the stream open");

    // One at a time: the two spawns the cap allows both finish (journaled), so the resume
    // spawns exactly the two left.
    const capped = { maxTotalSubagents: 2, maxConcurrentSubagents: 1 };
    const stopped = await session.factory.run("fanout", { args: { n: 4 }, limits: capped });
    assert.equal(stopped.status, "error", JSON.stringify(stopped));
    const resumed = await session.factory.resume(stopped.runId, { limits: { maxTotalSubagents: 10 } });
    assert.equal(resumed.status, "completed", JSON.stringify(resumed));
    const of = (events) => events.filter((e) => e.data.runId === stopped.runId);
    await until(() => of(settled).length === 2 && of(workflowSettled).length === 2, "both attempts settled");
    assert.deepEqual(
        of(started).map((e) => [e.type, e.data]),
        [1, 2].map((attempt) => [FACTORY_RUN_STARTED, { runId: stopped.runId, attempt, factoryName: "fanout" }]),
    );
    const [one, two] = of(settled).map((e) => e.data);
    assert.deepEqual([one.status, one.failureType, one.consumedSubagents], ["error", "factory_limit_reached", 2], JSON.stringify(one));
    assert.deepEqual([two.status, two.failureType, two.consumedSubagents], ["completed", undefined, 2], JSON.stringify(two));
    for (const data of [one, two]) {
        assert.ok(Number.isSafeInteger(data.elapsedMs) && data.elapsedMs >= 0, JSON.stringify(data));
        assert.deepEqual([data.consumedCredits, data.consumedCreditsNano], [0, 0], "the test agents cost nothing");
    }
    assert.equal(resumed.accounting.agentsSpawned, one.consumedSubagents + two.consumedSubagents);
    assert.ok(of(settled).every((e) => e.type === FACTORY_RUN_SETTLED && e.ephemeral === true));
    assert.deepEqual(of(workflowSettled).map((e) => [e.type, e.data]), of(settled).map((e) => ["workflow.run_settled", e.data]));
    for (const off of offs) off();
    await session.disconnect();
});

test("factory.run_updated: the session's runs, with increasing revisions", async () => {
    const session = await join();
    const other = await join();
    const events = [];
    const everything = [];
    const leaked = [];
    const off = session.on(FACTORY_RUN_UPDATED, (event) => events.push(event));
    const offAll = session.on((event) => everything.push(event));
    const offOther = other.on("factory.run_updated", (event) => leaked.push(event));

    const run = await session.factory.run("fanout", { args: { n: 2, prefix: "slow:", logs: 3 } });
    assert.equal(run.status, "completed");
    await until(() => events.some((e) => e.data.revision >= run.revision), "the run's last revision announced");
    const mine = events.filter((e) => e.data.runId === run.runId);
    assert.ok(mine.length >= 2, `${mine.length} events`);
    for (let i = 1; i < mine.length; i++) {
        assert.ok(mine[i].data.revision > mine[i - 1].data.revision, `revisions grow: ${mine.map((e) => e.data.revision)}`);
    }
    assert.equal(mine.at(-1).data.revision, run.revision);
    for (const event of mine) {
        assert.equal(event.type, "factory.run_updated");
        assert.equal(event.ephemeral, true);
        assert.deepEqual(Object.keys(event.data).sort(), ["revision", "runId"]);
    }
    assert.deepEqual(everything.filter((e) => e.data.runId === run.runId && e.type === FACTORY_RUN_UPDATED), mine);
    assert.deepEqual(leaked.filter((e) => e.data.runId === run.runId), [], "another session hears nothing of this run");
    off();
    offAll();
    offOther();
    await session.disconnect();
    await other.disconnect();
});

test("isFactoryRunTerminal is the terminal-status test", () => {
    for (const status of ["completed", "error", "halted", "cancelled"]) assert.equal(isFactoryRunTerminal(status), true, status);
    for (const status of ["running", "pending", "", undefined, null, "Completed"]) assert.equal(isFactoryRunTerminal(status), false, String(status));
});

test("a defineFactory handle registers its module (file#name) in the session only; a plain { meta, run } its source alone", async () => {
    assert.equal(echo.name, "node-echo");
    assert.equal(echo.module, DEFINITIONS_PATH);
    const plain = {
        meta: { name: "node-plain", description: "args: { word: string }" },
        run: async (ctx) => ({ word: ctx.args.word }),
    };
    const session = await join({ factories: [echo, FANOUT, plain] });
    assert.deepEqual(
        session.factories.map((f) => [f.name, f.source]),
        [["node-echo", DEFINITIONS_PATH], ["fanout", new URL(FANOUT).pathname], ["node-plain", "authored"]],
    );
    const run = await session.factory.run(echo, { args: { word: "hi" } });
    assert.deepEqual([run.status, run.result], ["completed", { word: "hi", reply: "ok" }]);
    assert.deepEqual((await session.factory.run(plain, { args: { word: "yo" } })).result, { word: "yo" });
    const stranger = await joinSession({ url: service.url, token: service.token });
    await assert.rejects(stranger.factory.run("node-echo"), (e) => e instanceof FactoryError && e.code === "unknown_factory");
    assert.throws(() => defineFactory({ meta: {}, run: async () => 1 }), TypeError);
    await assert.rejects(joinSession({ url: service.url, token: service.token, factories: [42] }), TypeError);
    await session.disconnect();
});

test("session.workflow and defineWorkflow: the same calls under the workflow names, with workflow_* resume codes", async () => {
    const echo = wfEcho;
    assert.equal(echo.name, "node-wf-echo");
    assert.throws(() => defineWorkflow({ meta: {}, run: async () => 1 }), /defineWorkflow/);
    await assert.rejects(joinSession({ url: service.url, token: service.token, factories: [], workflows: [] }), TypeError);
    const session = await joinSession({ url: service.url, token: service.token, workflows: [echo, FANOUT] });
    assert.deepEqual(session.workflows.map((w) => w.name), ["node-wf-echo", "fanout"]);
    const done = await session.workflow.run(echo, { args: { word: "hi" } });
    assert.deepEqual([done.status, done.result], ["completed", { word: "hi", reply: "ok" }]);
    assert.ok(isWorkflowRunTerminal(done.status));
    assert.deepEqual((await session.workflow.listRuns()).map((r) => r.runId), [done.runId]);

    // Resume refusals carry the workflow surface's codes, mapped from the service's.
    const refused = async (call, code, serviceCode) =>
        assert.rejects(call, (e) => {
            assert.ok(e instanceof WorkflowResumeError && e instanceof FactoryError && !(e instanceof FactoryResumeError), String(e));
            assert.deepEqual([e.name, e.code, e.serviceCode], ["WorkflowResumeError", code, serviceCode]);
            assert.ok(WORKFLOW_RESUME_ERROR_CODES.includes(e.code));
            return true;
        });
    await refused(session.workflow.resume("no-such-run"), "not_found", "not_found");
    await refused(session.workflow.resume(done.runId), "non_resumable", "non_resumable");
    const stopped = await session.workflow.run("fanout", { args: { n: 3 }, limits: { maxTotalSubagents: 1 } });
    assert.equal(stopped.status, "error");
    await refused(session.workflow.resume(stopped.runId, { limits: { maxTotalSubagents: 0 } }), "workflow_limits_invalid", "invalid_limits");
    await assert.rejects(
        session.factory.resume(stopped.runId, { limits: { maxTotalSubagents: 0 } }),
        (e) => e instanceof FactoryResumeError && e.code === "factory_limits_invalid" && e.serviceCode === "invalid_limits",
    );
    // `run(name, { resumeFromRunId })` resumes that run.
    const resumed = await session.workflow.run("fanout", { resumeFromRunId: stopped.runId, limits: { maxTotalSubagents: 10 } });
    assert.deepEqual([resumed.runId, resumed.status, resumed.attempts, resumed.result], [stopped.runId, "completed", 2, { done: 3 }]);

    // A service out of reach is storage unavailable to a resume.
    const gone = await joinSession({ url: "http://127.0.0.1:9", token: "x" });
    await assert.rejects(gone.factory.resume("r"), (e) => e instanceof FactoryResumeError && e.code === "factory_storage_unavailable");
    // After disconnect, runs and resumes are refused as the session's disposal.
    await session.disconnect();
    await refused(session.workflow.resume(stopped.runId), "workflow_session_disposed", "session_disposed");
    await assert.rejects(session.factory.resume(stopped.runId), (e) => e instanceof FactoryResumeError && e.code === "factory_session_disposed");
    await assert.rejects(session.factory.run("fanout"), (e) => e instanceof FactoryError && e.code === "factory_session_disposed");
});

test("a null limit override lifts the factory's declared ceiling, on run and on resume", async () => {
    const session = await join({ factories: [capped] });
    const stopped = await session.factory.run("node-capped", { args: { n: 4 } });
    assert.deepEqual([stopped.status, stopped.failure?.kind], ["error", "maxTotalSubagents"], JSON.stringify(stopped));
    const resumed = await session.factory.resume(stopped.runId, { limits: { maxTotalSubagents: null } });
    assert.deepEqual([resumed.status, resumed.result], ["completed", { done: 4 }], JSON.stringify(resumed));
    assert.equal((await session.factory.getRunDetail(stopped.runId)).limits.maxTotalSubagents, undefined, "lifted");
    const lifted = await session.factory.run("node-capped", { args: { n: 4 }, limits: { maxTotalSubagents: null } });
    assert.deepEqual([lifted.status, lifted.result, lifted.attempts], ["completed", { done: 4 }, 1], JSON.stringify(lifted));
    await session.disconnect();
});

test("the connection comes from options, FACTORY_URL/FACTORY_TOKEN, or the state directory", async () => {
    assert.deepEqual(resolveConnection({ stateDir: service.stateDir }, {}), { url: service.url, token: service.token });
    assert.deepEqual(resolveConnection({}, { FACTORY_STATE_DIR: service.stateDir }), { url: service.url, token: service.token });
    assert.deepEqual(resolveConnection({}, { FACTORY_URL: service.url, FACTORY_TOKEN: "t" }), { url: service.url, token: "t" });
    assert.throws(() => resolveConnection({}, { FACTORY_STATE_DIR: "/nonexistent/factory" }), (e) => e.code === "unavailable" && /FACTORY_URL/.test(e.message));
    const session = await joinSession({ stateDir: service.stateDir, factories: [FANOUT] });
    assert.equal((await session.factory.run("fanout")).status, "completed");
    await assert.rejects(
        joinSession({ url: service.url, token: "not-the-token", factories: [FANOUT] }),
        (e) => e instanceof FactoryError && e.code === "unauthorized" && e.httpStatus === 401,
    );
    const gone = await joinSession({ url: "http://127.0.0.1:9", token: "x" });
    await assert.rejects(gone.factory.listRuns(), (e) => e instanceof FactoryError && e.code === "unavailable");
});

test("notifyOnComplete and logPhaseNames tell the session that started the run (run, resume, workflow names)", async () => {
    const session = await join();
    const seen = [];
    const offs = [
        session.on(FACTORY_RUN_COMPLETED, (event) => seen.push(event)),
        session.on(FACTORY_PHASE_LOGGED, (event) => seen.push(event)),
        session.on("workflow.phase_logged", (event) => seen.push(event)),
    ];
    // Neither option: nothing is told.
    const quiet = await session.factory.run("fanout", { args: { n: 1 } });
    assert.equal(quiet.status, "completed");
    assert.deepEqual(seen, []);

    const told = await session.factory.run("fanout", { args: { n: 2, logs: 1 }, notifyOnComplete: true, logPhaseNames: true });
    assert.equal(told.status, "completed", JSON.stringify(told));
    const mine = (type) => seen.filter((e) => e.type === type && e.data.runId === told.runId).map((e) => e.data);
    assert.deepEqual(mine(FACTORY_PHASE_LOGGED), [{ runId: told.runId, phase: "Fan out" }, { runId: told.runId, phase: "Log" }]);
    assert.deepEqual(mine("workflow.phase_logged").map((d) => d.phase), ["Fan out", "Log"], "the workflow name hears them too");
    assert.deepEqual(mine(FACTORY_RUN_COMPLETED), [{ runId: told.runId, factory: "fanout", status: "completed", resultPreview: '{"done":2}' }]);
    const completed = seen.find((e) => e.type === FACTORY_RUN_COMPLETED);
    assert.deepEqual([completed.parentId, completed.ephemeral, typeof completed.id], [null, true, "string"]);

    // A resume tells too: the failure's type, then the completion after the raised limit.
    const stopped = await session.factory.run("fanout", { args: { n: 3 }, limits: { maxTotalSubagents: 1 }, notifyOnComplete: true });
    assert.deepEqual(mine(FACTORY_RUN_COMPLETED).length, 1);
    const stoppedNotes = seen.filter((e) => e.type === FACTORY_RUN_COMPLETED && e.data.runId === stopped.runId).map((e) => e.data);
    assert.deepEqual(stoppedNotes, [{ runId: stopped.runId, factory: "fanout", status: "error", failureType: "factory_limit_reached" }]);
    const resumed = await session.factory.resume(stopped.runId, { limits: { maxTotalSubagents: 10 }, notifyOnComplete: true, logPhaseNames: true });
    assert.equal(resumed.status, "completed");
    const resumedNotes = (type) => seen.filter((e) => e.type === type && e.data.runId === stopped.runId).map((e) => e.data.status ?? e.data.phase);
    assert.deepEqual(resumedNotes(FACTORY_PHASE_LOGGED), ["Fan out", "Log"], "the resumed attempt's phases, not the first attempt's again");
    assert.deepEqual(resumedNotes("workflow.phase_logged"), ["Fan out", "Log"]);
    assert.deepEqual(resumedNotes(FACTORY_RUN_COMPLETED), ["error", "completed"]);
    for (const off of offs) off();
    await session.disconnect();
});

test("onPermissionRequest: an untrusted factory is asked about; approved it runs, declined nothing starts; without it, no_approval_provider", async () => {
    // `fanout` registered for everyone (not this session's own), its trust revoked (`add`
    // trusts a script added here).
    factoryCli(service, ["add", fileURLToPath(FANOUT)]);
    factoryCli(service, ["trust", "--revoke", fileURLToPath(FANOUT)]);
    const asked = [];
    let answer = { kind: "denied-interactively-by-user" };
    const session = await joinSession({
        url: service.url,
        token: service.token,
        onPermissionRequest: async (request, invocation) => {
            asked.push({ request, invocation });
            return answer;
        },
    });
    // Declined: rejected with `declined`, and no run exists.
    await assert.rejects(session.factory.run("fanout", { args: { n: 1 }, limits: { maxTotalSubagents: 3 } }), (e) => {
        assert.ok(e instanceof FactoryError, String(e));
        assert.equal(e.code, "declined");
        return true;
    });
    assert.equal(asked.length, 1);
    const { request, invocation } = asked[0];
    assert.equal(request.kind, "factory");
    assert.equal(request.operation, "run");
    assert.equal(request.factoryName, "fanout");
    assert.match(request.approvalKey, /^[0-9a-f]{64}$/);
    assert.equal(request.limits.maxTotalSubagents, 3, JSON.stringify(request));
    assert.deepEqual(request.phases, ["Fan out", "Log"]);
    assert.equal(invocation.sessionId, session.sessionId);
    assert.deepEqual(await session.factory.listRuns(), [], "a declined start leaves no run");
    // Approved once: it runs to completion; asked again next time (once is not trust).
    answer = { kind: "approved" };
    const done = await session.factory.run("fanout", { args: { n: 2 } });
    assert.equal(done.status, "completed", JSON.stringify(done));
    assert.deepEqual(done.result, { done: 2 });
    assert.equal(asked.length, 2);
    assert.equal(asked[1].request.approvalKey, request.approvalKey);
    // A session without the callback gets today's refusal, at once.
    const plain = await joinSession({ url: service.url, token: service.token });
    await assert.rejects(plain.factory.run("fanout"), (e) => e instanceof FactoryError && e.code === "no_approval_provider");
    assert.deepEqual(await plain.factory.listRuns(), []);
    // Nothing was left pending.
    const pending = await fetch(`${service.url}/api/approvals`, { headers: { authorization: `Bearer ${service.token}` } });
    assert.deepEqual(await pending.json(), []);
    await session.disconnect();
    await plain.disconnect();
});
