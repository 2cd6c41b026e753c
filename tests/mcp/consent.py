"""The user's side of `factory mcp`'s consent questions, with the official MCP Python SDK.

`tests/mcp.rs` runs this with the `factory` binary and how the user answers every question
(`once`, `always`, `decline`, `dismiss`): the client declares elicitation, and its callback
notes each question (its message and form) and answers it. It runs the untrusted `probe`
twice, then authors a small factory and lists what is registered, and prints one JSON report.

usage: consent.py FACTORY_BIN ANSWER            (stdio)
       consent.py --http URL TOKEN ANSWER       (streamable HTTP)
"""

import json
import os
import sys

import anyio
from mcp import ClientSession
from mcp import types
from mcp.client.stdio import StdioServerParameters, stdio_client


def structured(result):
    return {
        "isError": bool(result.is_error),
        "structured": result.structured_content,
        "text": " ".join(c.text for c in result.content if getattr(c, "text", None)),
    }


def answering(answer, questions):
    async def on_question(context, params):
        questions.append({"message": params.message, "schema": params.requested_schema})
        if answer == "once":
            return types.ElicitResult(action="accept", content={"always": False})
        if answer == "always":
            return types.ElicitResult(action="accept", content={"always": True})
        if answer == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="cancel")

    return on_question


async def scenario(session, report):
    args = {"case": "fanout", "n": 2}
    report["first"] = structured(await session.call_tool("run_factory", {"name": "probe", "args": args}))
    report["second"] = structured(await session.call_tool("run_factory", {"name": "probe", "args": args}))
    body = "async ({ agent }) => ({ said: await agent('Say hi.', { label: 'hi' }) })"
    meta = {"name": "greeter", "description": "Says hi. args: none", "phases": [{"title": "Greet"}]}
    report["author"] = structured(await session.call_tool("factories_manage", {"operation": "author", "meta": meta, "run": body}))
    report["list"] = structured(await session.call_tool("factories_manage", {"operation": "list"}))
    report["runs"] = structured(await session.call_tool("factories_manage", {"operation": "runs"}))


async def main():
    questions = []
    report = {"questions": questions}
    if sys.argv[1] == "--http":
        from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

        url, token, answer = sys.argv[2], sys.argv[3], sys.argv[4]
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write, elicitation_callback=answering(answer, questions)) as session:
                    await session.initialize()
                    await scenario(session, report)
    else:
        factory, answer = sys.argv[1], sys.argv[2]
        params = StdioServerParameters(command=factory, args=["mcp"], env=dict(os.environ))
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, elicitation_callback=answering(answer, questions)) as session:
                await session.initialize()
                await scenario(session, report)
    print(json.dumps(report))


anyio.run(main)
