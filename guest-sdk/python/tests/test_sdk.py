"""The SDK's semantics under CPython, with the host's hooks faked (no component needed):
``python3 -m unittest discover -s tests -t .`` in ``guest-sdk/python`` (tests/python.rs runs
it). The real thing, through the `factory` binary, is tested in tests/python.rs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import unittest
from typing import Literal, Optional, TypedDict

import factory_sdk
from factory_sdk import MAX_ITEMS, Abort, Ctx, FactoryError, StepError, schema_of
from factory_sdk import _schema


class Err(Exception):
    """componentize-py's `Err`: the error case of a WIT result."""

    def __init__(self, value: object) -> None:
        self.value = value


class Abort_LimitReached:  # noqa: N801 - the name componentize-py generates
    def __init__(self, value: int) -> None:
        self.value = value


class Abort_Cancelled:  # noqa: N801
    value = None


class Started_Reply:  # noqa: N801
    def __init__(self, value: Optional[str]) -> None:
        self.value = value


class Started_Pending:  # noqa: N801
    def __init__(self, value: int) -> None:
        self.value = value


class Ok:
    """componentize-py's `Ok`: the success case of a WIT result in a record."""

    def __init__(self, value: object) -> None:
        self.value = value


@dataclasses.dataclass
class Finished:
    call: int
    outcome: object


class StepError_InvalidJson:  # noqa: N801
    def __init__(self, value: str) -> None:
        self.value = value


@dataclasses.dataclass
class AgentLimits:
    max_turns: Optional[int]
    max_duration_seconds: Optional[float]
    wrap_up: Optional[str]


@dataclasses.dataclass
class AgentOptions:
    label: Optional[str]
    schema: Optional[str]
    model: Optional[str]
    limits: AgentLimits = dataclasses.field(default_factory=lambda: AgentLimits(None, None, None))
    agent: Optional[str] = None
    reasoning_effort: Optional[str] = None
    context_tier: Optional[str] = None


class FakeWit:
    AgentOptions = AgentOptions
    AgentLimits = AgentLimits


class FakeHost:
    """The `ctx` and `agents` imports: replies by label, a journal, a log."""

    def __init__(self, replies: dict[str, object]) -> None:
        self.replies = replies
        self.calls: list[tuple[str, AgentOptions]] = []
        self.start_calls = 0
        self.waits = 0
        self.next_id = 0
        self.pending: dict[int, tuple[str, AgentOptions]] = {}
        self.lose_calls = False
        self.answered: dict[tuple[str, Optional[str]], Optional[str]] = {}
        self.journal: dict[str, str] = {}
        self.lines: list[str] = []
        self.phases: list[str] = []

    # agents
    def agent_start(self, prompt: str, options: AgentOptions) -> object:
        """The host's memo answers a call answered before at once; any other call is
        started and reported by `agent_wait`."""
        self.start_calls += 1
        if options.label == "refused-now":
            raise Err(Abort_Cancelled())
        if (prompt, options.label) in self.answered:
            return Started_Reply(self.answered[(prompt, options.label)])
        self.calls.append((prompt, options))
        self.next_id += 1
        self.pending[self.next_id] = (prompt, options)
        return Started_Pending(self.next_id)

    async def agent_wait(self) -> list[Finished]:
        """Every started call is done by the next wait: reported together."""
        self.waits += 1
        await asyncio.sleep(0)
        if self.lose_calls:
            return []
        done = []
        for call, (prompt, options) in sorted(self.pending.items()):
            reply = self.replies.get(options.label or "", json.dumps(f"reply to {prompt}"))
            if isinstance(reply, Err):
                done.append(Finished(call, reply))
                continue
            self.answered[(prompt, options.label)] = reply  # type: ignore[assignment]
            done.append(Finished(call, Ok(reply)))
        self.pending.clear()
        return done

    async def sleep(self, ms: int) -> None:
        await asyncio.sleep(0)

    # ctx
    def step_get(self, key: str) -> Optional[str]:
        return self.journal.get(key)

    def step_put(self, key: str, value: str) -> None:
        if key == "refused":
            raise Err(StepError_InvalidJson("not JSON"))
        self.journal[key] = value

    def phase(self, title: str) -> None:
        self.phases.append(title)

    def log(self, message: str) -> None:
        self.lines.append(message)

    def run_id(self) -> str:
        return "run-1"

    def cancelled(self) -> bool:
        return False


def with_host(replies: dict[str, object] | None = None) -> FakeHost:
    host = FakeHost(replies or {})
    factory_sdk._agents = host  # type: ignore[assignment]
    factory_sdk._hooks = host  # type: ignore[assignment]
    factory_sdk._wit = FakeWit  # type: ignore[assignment]
    factory_sdk._Err = Err  # type: ignore[assignment]
    return host


LIMIT = Err(Abort_LimitReached(0))


@dataclasses.dataclass
class Finding:
    title: str
    severity: int = 1


class Args(TypedDict, total=False):
    files: list[str]


class AgentTests(unittest.TestCase):
    def test_text_none_and_abort(self) -> None:
        host = with_host({"none": None, "stop": LIMIT})
        ctx: Ctx[dict] = Ctx({}, "{}")
        self.assertEqual(asyncio.run(ctx.agent("hi", label="a")), "reply to hi")
        self.assertIsNone(asyncio.run(ctx.agent("hi", label="none")))
        with self.assertRaises(Abort) as caught:
            asyncio.run(ctx.agent("hi", label="stop"))
        self.assertEqual((caught.exception.reason, caught.exception.limit), ("limit-reached", "maxTotalSubagents"))
        self.assertFalse(isinstance(caught.exception, Exception), "Abort is not an Exception")
        self.assertEqual(host.calls[0][1], AgentOptions("a", None, None))

    def test_a_memo_hit_is_answered_by_agent_start_without_a_wait(self) -> None:
        host = with_host({"none": None})
        ctx: Ctx[dict] = Ctx({}, "{}")
        self.assertEqual(asyncio.run(ctx.agent("hi", label="m")), "reply to hi")
        self.assertEqual(asyncio.run(ctx.agent("hi", label="m")), "reply to hi")
        self.assertIsNone(asyncio.run(ctx.agent("hi", label="none")))
        self.assertIsNone(asyncio.run(ctx.agent("hi", label="none")))
        self.assertEqual((host.start_calls, len(host.calls), host.waits), (4, 2, 2), "each call is started; two wait")
        with self.assertRaises(Abort) as caught:
            asyncio.run(ctx.agent("hi", label="refused-now"))
        self.assertEqual(caught.exception.reason, "cancelled")
        self.assertEqual((len(host.calls), host.waits), (2, 2), "an abort from agent_start starts nothing")

    def test_started_calls_share_one_wait_and_each_gets_its_own_outcome(self) -> None:
        host = with_host({"stop": LIMIT, "none": None})
        ctx: Ctx[dict] = Ctx({}, "{}")

        async def three() -> list[object]:
            return list(await asyncio.gather(
                ctx.agent("a", label="a"), ctx.agent("b", label="none"), ctx.agent("c", label="stop"), return_exceptions=True))

        got = asyncio.run(three())
        self.assertEqual(got[:2], ["reply to a", None])
        self.assertIsInstance(got[2], Abort)
        self.assertEqual(got[2].limit, "maxTotalSubagents")  # type: ignore[union-attr]
        self.assertEqual(host.waits, 1, "three pending calls, one wait reports them all")
        # A call started after the pump ended starts it again.
        self.assertEqual(asyncio.run(ctx.agent("d", label="d")), "reply to d")
        self.assertEqual(host.waits, 2)

    def test_a_host_that_reports_nothing_pending_fails_the_waiting_calls(self) -> None:
        host = with_host({})
        host.lose_calls = True
        ctx: Ctx[dict] = Ctx({}, "{}")
        with self.assertRaises(FactoryError) as caught:
            asyncio.run(ctx.agent("a", label="a"))
        self.assertIn("no pending call", str(caught.exception))
        host.lose_calls = False
        self.assertEqual(asyncio.run(ctx.agent("b", label="b")), "reply to b", "the next call waits afresh")

    def test_soft_limits_are_passed_on_and_bad_ones_refused(self) -> None:
        host = with_host({})
        ctx: Ctx[dict] = Ctx({}, "{}")
        asyncio.run(ctx.agent("hi", label="s", max_turns=3, max_duration_seconds=1.5, wrap_up="now"))
        self.assertEqual(host.calls[0][1].limits, AgentLimits(3, 1.5, "now"))
        for bad in [dict(max_turns=0), dict(max_turns=True), dict(max_duration_seconds=-1), dict(wrap_up=" ")]:
            with self.assertRaises((ValueError, TypeError), msg=str(bad)):
                asyncio.run(ctx.agent("hi", **bad))  # type: ignore[arg-type]
        self.assertEqual(len(host.calls), 1, "a refused call reaches no host")

    def test_agent_tuning_is_passed_on_and_bad_values_refused(self) -> None:
        host = with_host({})
        ctx: Ctx[dict] = Ctx({}, "{}")
        asyncio.run(ctx.agent("hi", label="t", agent="reviewer", reasoning_effort="high", context_tier="long_context"))
        options = host.calls[0][1]
        self.assertEqual((options.agent, options.reasoning_effort, options.context_tier), ("reviewer", "high", "long_context"))
        for bad in [dict(reasoning_effort="max"), dict(agent=""), dict(context_tier=3)]:
            with self.assertRaises((ValueError, TypeError), msg=str(bad)):
                asyncio.run(ctx.agent("hi", **bad))  # type: ignore[arg-type]
        self.assertEqual(len(host.calls), 1, "a refused call reaches no host")

    def test_schema_from_a_dataclass_converts_the_reply(self) -> None:
        host = with_host({"f": json.dumps({"title": "t", "severity": 2}), "bad": json.dumps({"title": 3})})
        ctx: Ctx[dict] = Ctx({}, "{}")
        self.assertEqual(asyncio.run(ctx.agent("p", label="f", schema=Finding)), Finding("t", 2))
        self.assertIsNone(asyncio.run(ctx.agent("p", label="bad", schema=Finding)))
        sent = json.loads(host.calls[0][1].schema or "")
        self.assertEqual(sent["required"], ["title"])
        self.assertEqual(sent["properties"]["severity"], {"type": "integer"})
        raw = asyncio.run(ctx.agent("p", label="f", schema={"type": "object"}))
        self.assertEqual(raw, {"title": "t", "severity": 2})


class CombinatorTests(unittest.TestCase):
    def test_parallel_is_none_on_failure_and_an_abort_fails_the_call(self) -> None:
        host = with_host({"stop": LIMIT})
        ctx: Ctx[dict] = Ctx({}, "{}")

        def boom() -> None:
            raise ValueError("x")

        got = asyncio.run(ctx.parallel([lambda: ctx.agent("a", label="a"), boom, ctx.agent("b", label="b")]))
        self.assertEqual(got, ["reply to a", None, "reply to b"])
        self.assertIn("parallel: item 1 failed: ValueError: x", host.lines)

        async def swallow() -> str:
            try:
                await ctx.parallel([lambda: ctx.agent("a", label="stop")])
            except Exception:  # noqa: BLE001 - must not catch an Abort
                return "swallowed"
            return "no abort"

        with self.assertRaises(Abort):
            asyncio.run(swallow())

    def test_the_item_cap(self) -> None:
        with_host()
        ctx: Ctx[dict] = Ctx({}, "{}")
        asyncio.run(ctx.parallel([lambda: 1] * MAX_ITEMS))
        with self.assertRaises(FactoryError):
            asyncio.run(ctx.parallel([lambda: 1] * (MAX_ITEMS + 1)))
        with self.assertRaises(FactoryError):
            asyncio.run(ctx.pipeline(range(MAX_ITEMS + 1), lambda p, i, n: p))

    def test_pipeline_has_no_barrier_and_skips_later_stages_of_a_failed_item(self) -> None:
        host = with_host({"stop": LIMIT})
        ctx: Ctx[dict] = Ctx({}, "{}")
        seen: list[tuple[object, object, int]] = []

        async def first(prev: int, item: int, index: int) -> int:
            if item == 1:
                raise RuntimeError("no")
            return prev * 10

        def second(prev: int, item: int, index: int) -> str:
            seen.append((prev, item, index))
            return f"{prev}:{item}:{index}"

        self.assertEqual(asyncio.run(ctx.pipeline([0, 1, 2], first, second)), ["0:0:0", None, "20:2:2"])
        self.assertEqual(sorted(seen), [(0, 0, 0), (20, 2, 2)])
        self.assertIn("pipeline stage 1: item 1 failed: RuntimeError: no", host.lines)
        with self.assertRaises(Abort):
            asyncio.run(ctx.pipeline([0], lambda p, i, n: ctx.agent("x", label="stop")))


class StepTests(unittest.TestCase):
    def test_steps_journal_json_and_replay(self) -> None:
        host = with_host()
        ctx: Ctx[dict] = Ctx({}, "{}")
        calls: list[int] = []

        def producer() -> dict:
            calls.append(1)
            return {"t": (1, 2), "f": Finding("a")}

        first = asyncio.run(ctx.step("k", producer))
        again = asyncio.run(ctx.step("k", producer))
        self.assertEqual(first, {"t": [1, 2], "f": {"title": "a", "severity": 1}})
        self.assertEqual(again, first)
        self.assertEqual(len(calls), 1, "replayed from the journal")

        async def asynced() -> int:
            return 5

        self.assertEqual(asyncio.run(ctx.step("a", asynced)), 5)
        self.assertEqual(asyncio.run(ctx.step("v", lambda: 1, volatile=True)), 1)
        self.assertNotIn("v", host.journal)
        with self.assertRaises(StepError):
            asyncio.run(ctx.step("nan", lambda: float("nan")))
        with self.assertRaises(StepError):
            asyncio.run(ctx.step("refused", lambda: 1))


class SchemaTests(unittest.TestCase):
    def test_schemas_from_types(self) -> None:
        self.assertEqual(schema_of(list[str]), {"type": "array", "items": {"type": "string"}})
        self.assertEqual(schema_of(Optional[int]), {"anyOf": [{"type": "integer"}, {"type": "null"}]})
        self.assertEqual(schema_of(Literal["a", "b"]), {"enum": ["a", "b"]})
        self.assertEqual(
            schema_of(Args),
            {"type": "object", "properties": {"files": {"type": "array", "items": {"type": "string"}}}, "required": []},
        )
        self.assertEqual(schema_of({"type": "object"}), {"type": "object"})
        with self.assertRaises(TypeError):
            schema_of(complex)

    def test_conversion(self) -> None:
        self.assertEqual(_schema.convert(Finding, {"title": "x"}), Finding("x"))
        self.assertEqual(_schema.convert(list[Finding], [{"title": "x", "severity": 2}]), [Finding("x", 2)])
        self.assertEqual(_schema.convert(float, 1), 1.0)
        with self.assertRaises(TypeError):
            _schema.convert(int, True)
        with self.assertRaises(TypeError):
            _schema.convert(Finding, {"severity": 1})


class MetaTests(unittest.TestCase):
    def test_the_decorator_registers_one_factory(self) -> None:
        factory_sdk._REGISTERED.clear()

        @factory_sdk.factory(name="n", description="d", phases=["A", ("B", "detail")], max_total_subagents=3, args=Args)
        async def run(ctx: Ctx[Args]) -> None:
            return None

        meta, fn = factory_sdk._registered()
        self.assertIs(fn, run)
        self.assertEqual([p.title for p in meta.phases], ["A", "B"])
        self.assertEqual(meta.phases[1].detail, "detail")
        self.assertEqual(meta.max_total_subagents, 3)
        self.assertEqual(meta.args_schema, schema_of(Args))
        with self.assertRaises(TypeError):
            factory_sdk.factory(name="x", description="y")(lambda ctx: None)  # type: ignore[arg-type]
        factory_sdk._REGISTERED.clear()


if __name__ == "__main__":
    unittest.main()
