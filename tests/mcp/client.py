"""An agent's side of `factory mcp`, written with the official MCP Python SDK (`mcp`).

`tests/mcp.rs` runs this with the `factory` binary and a scenario name; it drives the
server over stdio exactly as an MCP client (Claude Code, VS Code, ...) would and prints one
JSON report on stdout for the Rust test to check against what the backend really saw.

usage: client.py FACTORY_BIN SCENARIO [SESSION_CLIENT_NAME]
"""

import json
import os
import sys

import anyio
from mcp import ClientSession
from mcp import types
from mcp.client.stdio import StdioServerParameters, stdio_client


#: The log notifications (`notifications/message`) the server sent, as the SDK's logging callback saw them.
LOGS = []


async def on_log(params):
    LOGS.append({"level": params.level, "logger": params.logger, "data": params.data})


def structured(result):
    """The structured content of a tool result, with its error flag and text."""
    return {
        "isError": bool(result.is_error),
        "structured": result.structured_content,
        "text": " ".join(c.text for c in result.content if getattr(c, "text", None)),
    }


async def lifecycle(session, report):
    """initialize, list tools, list factories, run into a cap, find the run, resume it."""
    tools = await session.list_tools()
    report["tools"] = {t.name: t.input_schema for t in tools.tools}
    report["list"] = structured(await session.call_tool("factories_manage", {"operation": "list"}))
    report["inspect"] = structured(await session.call_tool("factories_manage", {"operation": "inspect", "name": "probe"}))

    progress = []

    async def on_progress(value, total, message):
        progress.append({"progress": value, "total": total, "message": message})

    stopped = await session.call_tool(
        "run_factory",
        {"name": "probe", "args": {"case": "fanout", "n": 6}, "limits": {"maxTotalSubagents": 3, "maxConcurrentSubagents": 1}},
        progress_callback=on_progress,
    )
    report["stopped"] = structured(stopped)
    report["progress"] = progress
    report["runs"] = structured(await session.call_tool("factories_manage", {"operation": "runs"}))
    run_id = stopped.structured_content["runId"]
    # `null` lifts the cap that stopped it.
    resumed = await session.call_tool(
        "run_factory", {"resumeFromRunId": run_id, "limits": {"maxTotalSubagents": None}}
    )
    report["resumed"] = structured(resumed)
    report["show"] = structured(await session.call_tool("factories_manage", {"operation": "show", "runId": run_id}))
    report["progressPage"] = structured(
        await session.call_tool("factories_manage", {"operation": "progress", "runId": run_id, "limit": 5})
    )
    # Authoring: a self-contained async function expression, registered in this session only.
    body = """async ({ args, agent, phase }) => {
        const VERDICT = { type: "object", properties: { real: { type: "boolean" } }, required: ["real"] };
        phase("Inspect");
        const finding = await agent(`Name one likely bug in ${args.file ?? "the code"}.`, { label: "inspector" });
        if (!finding) return { finding: null, real: false };
        phase("Verify");
        const verdict = await agent(`Is this a real bug? Claim: ${finding}`, { label: "verifier", schema: VERDICT });
        return { finding, real: verdict?.real === true };
    }"""
    meta = {"name": "bug-hunt", "description": "Find and verify one bug. args: { file?: string }", "phases": [{"title": "Inspect"}, {"title": "Verify"}]}
    report["author"] = structured(await session.call_tool("factories_manage", {"operation": "author", "meta": meta, "run": body}))
    report["listAfterAuthor"] = structured(await session.call_tool("factories_manage", {"operation": "list"}))
    report["authoredRun"] = structured(await session.call_tool("run_factory", {"name": "bug-hunt", "args": {"file": "src/a.rs"}}))
    report["badAuthor"] = structured(
        await session.call_tool("factories_manage", {"operation": "author", "meta": {"name": "broken", "description": "x"}, "run": "async (ctx) => { return ( }"})
    )
    # Pre-run failures are tool errors with the spec's codes.
    report["unknown"] = structured(await session.call_tool("run_factory", {"name": "no-such-factory"}))
    report["completedAgain"] = structured(await session.call_tool("run_factory", {"resumeFromRunId": run_id}))
    report["badLimits"] = structured(
        await session.call_tool("run_factory", {"name": "probe", "limits": {"maxTotalSubagents": 0}})
    )
    report["bothBranches"] = structured(
        await session.call_tool("run_factory", {"name": "probe", "resumeFromRunId": run_id})
    )
    report["runsPage"] = structured(await session.call_tool("factories_manage", {"operation": "runs", "limit": 1}))
    # Pages by creation sequence: the newest, then older, then newer again.
    newest = structured(await session.call_tool("factories_manage", {"operation": "runs", "beforeSeq": 10**12, "limit": 1}))
    older = structured(await session.call_tool(
        "factories_manage", {"operation": "runs", "beforeSeq": newest["structured"]["oldestSeq"], "limit": 1}))
    newer = structured(await session.call_tool(
        "factories_manage", {"operation": "runs", "afterSeq": older["structured"]["newestSeq"], "limit": 1}))
    report["seqPages"] = [newest, older, newer]
    authored_id = report["authoredRun"]["structured"]["runId"]
    report["removed"] = structured(await session.call_tool("factories_manage", {"operation": "remove", "runId": authored_id}))
    report["runsAfterRemove"] = structured(await session.call_tool("factories_manage", {"operation": "runs"}))


async def cancel(session, report):
    """Start a slow run, abandon the call once it is under way: the run ends cancelled."""
    started = anyio.Event()

    async def on_progress(value, total, message):
        if value >= 1:
            started.set()

    async def call():
        await session.call_tool(
            "run_factory",
            {"name": "probe", "args": {"case": "fanout", "n": 50}, "limits": {"maxConcurrentSubagents": 1}},
            progress_callback=on_progress,
        )

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        with anyio.fail_after(60):
            await started.wait()
        group.cancel_scope.cancel()  # abandons the request: the SDK sends notifications/cancelled
    runs = await session.call_tool("factories_manage", {"operation": "runs"})
    run_id = runs.structured_content["runs"][-1]["runId"]
    report["waited"] = structured(await session.call_tool("factories_manage", {"operation": "wait", "runId": run_id}))


async def pause(session, report):
    """Start a slow run, pause it from a second call once under way: the first call returns
    the paused envelope; resume it to the end. Then a run that waits at a checkpoint, answered
    through factories_manage `resume` with `input`."""
    started = anyio.Event()
    first = {}

    async def on_progress(value, total, message):
        if value >= 1:
            started.set()

    async def call():
        first["paused"] = structured(
            await session.call_tool(
                "run_factory",
                {"name": "probe", "args": {"case": "fanout", "n": 100}, "limits": {"maxConcurrentSubagents": 1}},
                progress_callback=on_progress,
            )
        )

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        with anyio.fail_after(60):
            await started.wait()
        runs = await session.call_tool("factories_manage", {"operation": "runs"})
        run_id = runs.structured_content["runs"][-1]["runId"]
        report["pause"] = structured(await session.call_tool("factories_manage", {"operation": "pause", "runId": run_id}))
    report["paused"] = first["paused"]
    report["resumed"] = structured(await session.call_tool("factories_manage", {"operation": "resume", "runId": run_id}))
    checkpoint = await session.call_tool("run_factory", {"name": "probe", "args": {"case": "checkpoint"}})
    report["checkpoint"] = structured(checkpoint)
    report["answered"] = structured(
        await session.call_tool(
            "factories_manage",
            {"operation": "resume", "runId": checkpoint.structured_content["runId"], "input": {"approved": True}},
        )
    )


async def untrusted(session, report):
    """A component that is not trusted cannot run: MCP has no way to ask the user."""
    report["refused"] = structured(await session.call_tool("run_factory", {"name": "probe", "args": {"case": "fanout", "n": 1}}))


async def other_session(session, report):
    """Another client: it sees none of the first one's runs."""
    report["runs"] = structured(await session.call_tool("factories_manage", {"operation": "runs"}))
    run_id = os.environ.get("FOREIGN_RUN_ID", "")
    report["show"] = structured(await session.call_tool("factories_manage", {"operation": "show", "runId": run_id}))
    report["resume"] = structured(await session.call_tool("run_factory", {"resumeFromRunId": run_id}))
    report["remove"] = structured(await session.call_tool("factories_manage", {"operation": "remove", "runId": run_id}))
    report["list"] = structured(await session.call_tool("factories_manage", {"operation": "list"}))
    report["authored"] = structured(await session.call_tool("run_factory", {"name": "bug-hunt"}))


async def gc(session, report):
    """Run a small factory to its end, then collect this session's ended runs: no policy is
    refused, a dry run lists them, a real pass deletes them (another session's run stays)."""
    report["run"] = structured(await session.call_tool("run_factory", {"name": "probe", "args": {"case": "fanout", "n": 1}}))
    report["noPolicy"] = structured(await session.call_tool("factories_manage", {"operation": "gc"}))
    report["dry"] = structured(await session.call_tool("factories_manage", {"operation": "gc", "keepLast": 0, "dryRun": True}))
    report["runsAfterDry"] = structured(await session.call_tool("factories_manage", {"operation": "runs"}))
    report["gc"] = structured(await session.call_tool("factories_manage", {"operation": "gc", "keepDays": 0}))
    report["runsAfterGc"] = structured(await session.call_tool("factories_manage", {"operation": "runs"}))


async def start(session, report):
    """Run one small factory to its end: the run another connection must not see."""
    report["run"] = structured(await session.call_tool("run_factory", {"name": "probe", "args": {"case": "fanout", "n": 1}}))


async def hang(session, report):
    """Start a long run and wait on it: the test kills this client (and its server) meanwhile."""
    report["run"] = structured(await session.call_tool(
        "run_factory", {"name": "probe", "args": {"case": "fanout", "n": 30}, "limits": {"maxConcurrentSubagents": 1}}))


async def bounded(session, report):
    """A run longer than the server's bound: `running` at the bound, then waited for to its end."""
    report["first"] = structured(await session.call_tool(
        "run_factory", {"name": "probe", "args": {"case": "fanout", "n": 8}, "limits": {"maxConcurrentSubagents": 1}}))
    run_id = report["first"]["structured"]["runId"]
    waits = []
    while True:
        waited = structured(await session.call_tool("factories_manage", {"operation": "wait", "runId": run_id}))
        waits.append(waited)
        if waited["structured"]["status"] != "running" or len(waits) > 120:
            break
    report["waits"] = waits


async def notify(session, report):
    """A run that outlasts the call's bound: the session is told its phases and its end."""
    report["first"] = structured(await session.call_tool(
        "run_factory",
        {"name": "probe", "args": {"case": "fanout", "n": 8}, "limits": {"maxConcurrentSubagents": 1}, "logPhaseNames": True}))
    run_id = report["first"]["structured"]["runId"]
    with anyio.fail_after(120):
        while not any(log["data"].get("event") == "factory_completed" and log["data"].get("runId") == run_id for log in LOGS):
            await anyio.sleep(0.05)
    # Without notifyOnComplete: nothing is told; the run is waited for instead.
    report["quiet"] = structured(await session.call_tool(
        "run_factory",
        {"name": "probe", "args": {"case": "fanout", "n": 8}, "limits": {"maxConcurrentSubagents": 1}, "notifyOnComplete": False}))
    quiet_id = report["quiet"]["structured"]["runId"]
    while True:
        waited = structured(await session.call_tool("factories_manage", {"operation": "wait", "runId": quiet_id}))
        if waited["structured"]["status"] != "running":
            break
    report["quietWaited"] = waited
    report["logs"] = LOGS


async def over_http(url, token, report):
    """The same server over MCP's streamable HTTP transport, with the bearer token."""
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write, client_info=types.Implementation(name="http-agent", version="1")) as session:
                init = await session.initialize()
                report["server"] = init.server_info.name
                tools = await session.list_tools()
                report["tools"] = sorted(t.name for t in tools.tools)
                report["list"] = structured(await session.call_tool("factories_manage", {"operation": "list"}))
                report["run"] = structured(
                    await session.call_tool("run_factory", {"name": "probe", "args": {"case": "fanout", "n": 3}})
                )


async def main():
    if sys.argv[1] == "--http":
        report = {}
        await over_http(sys.argv[2], sys.argv[3], report)
        print(json.dumps(report))
        return
    factory, scenario = sys.argv[1], sys.argv[2]
    client_name = sys.argv[3] if len(sys.argv) > 3 else "pytest-agent"
    params = StdioServerParameters(command=factory, args=["mcp"], env=dict(os.environ))
    report = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(
            read, write, client_info=types.Implementation(name=client_name, version="1"), logging_callback=on_log
        ) as session:
            init = await session.initialize()
            report["server"] = init.server_info.name
            await {"lifecycle": lifecycle, "cancel": cancel, "other": other_session, "lifecycle_untrusted": untrusted, "start": start, "bounded": bounded, "hang": hang, "notify": notify, "pause": pause, "gc": gc}[scenario](session, report)
    print(json.dumps(report))


anyio.run(main)
