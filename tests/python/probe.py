"""The Python test factory of tests/python.rs: every ctx function, failures, aborts, the
sandbox and hostile behaviour, selected by `args.mode`."""

import asyncio
import os
import random
import socket
import time
from dataclasses import dataclass

from factory_sdk import Abort, Ctx, factory


@dataclass
class Finding:
    file: str
    severity: int


@factory(
    name="py-probe",
    description="Python SDK probe. args: { mode: string, n?: int }",
    phases=["One", ("Two", "the second phase")],
    max_concurrent_subagents=8,
)
async def run(ctx: Ctx) -> object:
    mode = ctx.args.get("mode", "all")
    if mode == "all":
        ctx.phase("One")
        ctx.log(f"run id {ctx.run_id}")
        text = await ctx.agent("hello", label="text")
        failed = await ctx.agent("this one fails", label="fails")
        ctx.log(f"failed agent -> {failed!r}")
        structured = await ctx.agent("a finding", label="schema", schema=Finding)
        raw = await ctx.agent("raw", label="raw", schema={"type": "object"})
        par = await ctx.parallel([lambda i=i: ctx.agent(f"p{i}", label=f"p{i}") for i in range(3)])
        def fail() -> None:
            raise ValueError("item failed")
        mixed = await ctx.parallel([lambda: ctx.agent("ok", label="ok"), fail])
        async def stage2(prev: str, item: int, index: int) -> str:
            if item == 1:
                raise RuntimeError("stage failed")
            return f"{prev}|{item}|{index}"
        piped = await ctx.pipeline([0, 1, 2], lambda prev, item, i: ctx.agent(f"s{item}", label=f"s{item}"), stage2)
        ctx.phase("Two")
        counted = await ctx.step("count", lambda: {"n": 1, "t": (1, 2)})
        async def producer() -> list[int]:
            return [1, 2, 3]
        asynced = await ctx.step("async", producer)
        vol = await ctx.step("vol", lambda: 7, volatile=True)
        await ctx.sleep(1)
        return {
            "text": text, "failed": failed, "structured": None if structured is None else [structured.file, structured.severity],
            "raw": raw, "par": par, "mixed": mixed, "piped": piped, "counted": counted, "asynced": asynced,
            "vol": vol, "cancelled": ctx.cancelled(), "runIdLen": len(ctx.run_id),
        }
    if mode == "raise":
        def inner() -> None:
            raise KeyError("missing-key")
        inner()
    if mode == "abort":
        try:
            await ctx.parallel([lambda i=i: ctx.agent(f"a{i}", label=f"a{i}") for i in range(5)])
        except Exception:
            ctx.log("abort swallowed as an Exception")
            return "swallowed"
        except Abort as abort:
            ctx.log(f"abort propagated: {abort.reason} {abort.limit}")
            raise
        return "not aborted"
    if mode == "fanout":
        n = int(ctx.args.get("n", 10))
        replies = await ctx.parallel(ctx.agent(f"item {i}", label=f"t:{i}") for i in range(n))
        return {"done": sum(1 for r in replies if r is not None)}
    if mode == "abandon":
        # A call started and never awaited: the run returns without waiting for it.
        asyncio.get_running_loop().create_task(ctx.agent("left behind", label="slow"))
        return await ctx.agent("waited for", label="fast")
    if mode == "wasi":
        print("hello from print")
        seen = {"env": dict(os.environ), "time": time.time() > 1_600_000_000, "random": random.random() < 1.0}
        try:
            with open("/etc/passwd") as f:
                seen["file"] = f.read(10)
        except OSError as e:
            seen["file"] = type(e).__name__
        try:
            seen["listdir"] = os.listdir("/")
        except OSError as e:
            seen["listdir"] = type(e).__name__
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1)
            seen["socket"] = "connected"
        except Exception as e:  # noqa: BLE001
            seen["socket"] = type(e).__name__
        return seen
    if mode == "too-many":
        return await ctx.parallel([lambda: 1] * 4097)
    if mode == "spin":
        n = 0
        while True:
            n += 1
    if mode == "bomb":
        blocks = []
        while True:
            blocks.append(bytearray(16 << 20))
    return None
