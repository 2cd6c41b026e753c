// The spec's own snippets (docs/factories.md of @github/copilot-sdk), run against a real
// `factory serve --http`: "Define and register a factory" is extensions/review-changed.mjs,
// loaded as an extension; "Run and resume" and "Observe a run" are here, verbatim between the
// BEGIN/END markers. Each snippet here is the body of a function whose parameters are the
// snippet's free variables (`session`, `runId`, `phaseId`, ...), so the text is the spec's;
// only the first snippet's `import` line is replaced by importing this package
// (`@factory/client`: `@github/copilot-sdk/extension` is not installed here), and the abort
// snippet's 30-second timer is unref'd (its `setTimeout` is shadowed) so it does not keep the
// test process alive once the wait has settled.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { joinSession } from "../index.js";
import { startService } from "./helpers.mjs";

let service;
before(async () => {
    service = await startService();
    // The first snippet calls joinSession without options: the environment says where.
    process.env.FACTORY_URL = service.url;
    process.env.FACTORY_TOKEN = service.token;
    process.env.FACTORY_SESSION = `spec-snippets-${process.pid}`;
});
after(async () => {
    await service?.stop();
});

async function defineAndRegister() {
    // The spec's "Define and register a factory" is extensions/review-changed.mjs (verbatim
    // but for its import line), loaded as an extension is: its `joinSession()` joins the
    // session FACTORY_SESSION names, which this program then joins too.
    await import("./extensions/review-changed.mjs");
    return joinSession();
}

async function runSnippet(session) {
    // BEGIN spec "Run and resume": run
    const run = await session.factory.run("review-changed", {
        args: { files: ["src/a.ts"] },
        limits: { maxAiCredits: 3 },
    });

    if (run.status === "completed") {
        console.log(run.result);
    } else {
        console.error(`run ${run.runId} ended as ${run.status}`, run.failure ?? run.error);
    }
    // END
    return run;
}

async function resumeSnippet(session, runId) {
    // BEGIN spec "Run and resume": resume
    const run = await session.factory.resume(runId, {
        limits: { maxAiCredits: 6 },
    });
    // END
    return run;
}

async function observeSnippet(session, runId, phaseId, afterSeq, beforeSeq, limit) {
    // BEGIN spec "Observe a run"
    const runs = await session.factory.listRuns();
    const detail = await session.factory.getRunDetail(runId);
    const page = await session.factory.getRunProgress(runId, {
        phaseId,
        afterSeq,
        beforeSeq,
        limit,
    });
    // END
    return { runs, detail, page };
}

async function waitSnippet(session, runId) {
    // BEGIN spec "Observe a run": waitForRun
    const settled = await session.factory.waitForRun(runId);
    if (settled.status === "completed") {
        console.log(settled.result);
    }
    // END
    return settled;
}

async function abortableWaitSnippet(session, runId) {
    const setTimeout = (callback, ms) => globalThis.setTimeout(callback, ms).unref();
    // BEGIN spec "Observe a run": waitForRun with a signal
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 30_000);
    const settled = await session.factory.waitForRun(runId, { signal: controller.signal });
    // END
    return settled;
}

test("the spec's snippets run unchanged against the service", async () => {
    const session = await defineAndRegister();
    assert.equal(session.sessionId, process.env.FACTORY_SESSION);

    // A run that the credit budget stops (each review costs 2 AI credits on the test
    // backend; one at a time, the third is refused at 4 spent of 3): the run to resume.
    const stopped = await session.factory.run("review-changed", {
        args: { files: ["src/a.ts", "src/b.ts", "src/c.ts"] },
        limits: { maxAiCredits: 3, maxConcurrentSubagents: 1 },
    });
    assert.equal(stopped.status, "error", JSON.stringify(stopped));
    assert.deepEqual([stopped.failure.type, stopped.failure.kind], ["factory_limit_reached", "maxAiCredits"]);

    const run = await runSnippet(session);
    assert.equal(run.status, "completed", JSON.stringify(run));
    assert.deepEqual(run.result, { reviews: ["looks fine"] });

    const resumed = await resumeSnippet(session, stopped.runId);
    assert.equal(resumed.runId, stopped.runId);
    assert.equal(resumed.status, "completed", JSON.stringify(resumed));
    assert.deepEqual(resumed.result, { reviews: ["looks fine", "looks fine", "looks fine"] });
    assert.equal(resumed.attempts, 2);
    assert.equal(resumed.accounting.aiCreditsNano, 6e9, "the two journaled reviews replayed for free");

    const { runs, detail, page } = await observeSnippet(session, stopped.runId, "Review", 0, undefined, 100);
    assert.deepEqual(runs.map((r) => r.runId), [stopped.runId, run.runId]);
    assert.equal(detail.runId, stopped.runId);
    assert.deepEqual(detail.phases, ["Review", "Verify"]);
    assert.ok(page.length > 0 && page.every((entry) => entry.phase === "Review"), JSON.stringify(page));

    assert.deepEqual(await waitSnippet(session, stopped.runId), resumed);
    assert.deepEqual(await abortableWaitSnippet(session, run.runId), run);
    await session.disconnect();
});
