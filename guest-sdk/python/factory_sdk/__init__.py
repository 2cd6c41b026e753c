"""The Python guest SDK for ``factory`` agent factories.

A factory is one ``async def`` decorated with :func:`factory`::

    from factory_sdk import Ctx, factory

    @factory(name="review-changed",
             description="Review changed files. args: { files: string[] }",
             phases=["Review", "Verify"],
             max_concurrent_subagents=3, max_total_subagents=10)
    async def run(ctx: Ctx) -> dict:
        ctx.phase("Review")
        reviews = await ctx.parallel(
            ctx.agent(f"Review {f}", label=f"review:{f}") for f in ctx.args["files"])
        ctx.phase("Verify")
        return await ctx.step("report", lambda: {"reviews": reviews})

``factory build x.py`` (or ``factory run x.py``) turns the file into a WebAssembly component
with ``componentize-py``; this package is embedded in it. Everything the factory can do goes
through :class:`Ctx`: subagents (:meth:`Ctx.agent`), the journal (:meth:`Ctx.step`), progress
(:meth:`Ctx.phase`, :meth:`Ctx.log`) and the combinators :meth:`Ctx.parallel` and
:meth:`Ctx.pipeline`.

Failures come in two kinds, as in every factory SDK:

* an *ordinary* failure (a subagent errored, replied nothing, or its reply failed the schema
  twice) is ``None``: guard every result;
* an :class:`Abort` means the run itself must stop (cancelled, a limit reached, the store
  failed, an invalid call). It derives from ``BaseException`` (like
  ``asyncio.CancelledError``), so ``except Exception`` does not swallow it by accident. Let it
  propagate: the host ends the attempt with the real cause whatever the factory does next.

The event loop is the component's own (driven by the host's async calls): ``asyncio.gather``,
``asyncio.create_task`` and ``asyncio.wait`` work; ``asyncio.sleep`` with a delay does not,
use :meth:`Ctx.sleep`. There is no file system, network or environment inside the sandbox.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Generic, TypeVar, Union, cast, overload

from . import _schema

try:  # Present inside the component (componentize-py generates them), absent in an editor.
    from wit_world.imports import agents as _agents
    from wit_world.imports import ctx as _hooks
    from wit_world.imports import types as _wit
    from componentize_py_types import Err as _Err
except ImportError:  # pragma: no cover - outside a component
    _agents = _hooks = _wit = None  # type: ignore[assignment]
    _Err = None  # type: ignore[assignment,misc]

try:  # componentize-py's: work that keeps the component's task alive until it is done.
    from componentize_py_async_support import spawn as _spawn
except ImportError:  # outside a component (the unit tests): an asyncio task
    _spawn = None

__all__ = [
    "MAX_ITEMS",
    "Abort",
    "Ctx",
    "FactoryError",
    "Meta",
    "Phase",
    "StepError",
    "factory",
    "schema_of",
]

#: The most items one :meth:`Ctx.parallel` or :meth:`Ctx.pipeline` call accepts.
MAX_ITEMS = 4096

T = TypeVar("T")
A = TypeVar("A")

#: A JSON value: what steps, schema replies and the run's result are made of.
Json = Any


# --------------------------------------------------------------------------- errors


class Abort(BaseException):
    """The run must stop: propagate it (do not catch it).

    ``reason`` is one of ``"cancelled"``, ``"limit-reached"``, ``"storage"``,
    ``"invalid-call"``, ``"sandbox-limit"``, ``"backend"``, ``"halted"``, ``"paused"``; ``limit`` names
    the limit for ``"limit-reached"`` (``"maxTotalSubagents"``, ``"timeoutSeconds"``, ``"maxAiCredits"``);
    ``message`` is the checkpoint's key for ``"paused"`` at a checkpoint (empty for a caller's pause).
    """

    def __init__(self, reason: str, message: str = "", limit: str | None = None) -> None:
        self.reason = reason
        self.message = message
        self.limit = limit
        detail = limit if limit is not None else message
        super().__init__(f"run aborted: {reason}" + (f" ({detail})" if detail else ""))


class FactoryError(Exception):
    """An ordinary error raised by the SDK (invalid args, too many items, a bad step value).

    Inside :meth:`Ctx.parallel` and :meth:`Ctx.pipeline` it turns its item into ``None``;
    out of ``run`` it ends the attempt with status ``error``.
    """


class StepError(FactoryError):
    """A step's value could not be journaled (it is not JSON)."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"step `{key}`: {message}")


_LIMIT_NAMES = {0: "maxTotalSubagents", 1: "timeoutSeconds", 2: "maxAiCredits"}


def _abort_from_wit(value: Any) -> Abort:
    name = type(value).__name__
    if name == "Abort_Cancelled":
        return Abort("cancelled")
    if name == "Abort_LimitReached":
        kind = getattr(value.value, "value", value.value)
        return Abort("limit-reached", limit=_LIMIT_NAMES.get(kind, str(kind)))
    if name == "Abort_Storage":
        return Abort("storage", value.value)
    if name == "Abort_InvalidCall":
        return Abort("invalid-call", value.value)
    if name == "Abort_SandboxLimit":
        return Abort("sandbox-limit", value.value)
    if name == "Abort_Backend":
        return Abort("backend", value.value)
    if name == "Abort_Halted":
        return Abort("halted")
    if name == "Abort_Paused":
        return Abort("paused", value.value or "")
    return Abort("unknown", repr(value))


def _require_host() -> None:
    if _hooks is None:
        raise RuntimeError("factory_sdk runs inside a factory component: build it with `factory build`")


# --------------------------------------------------------------------------- meta


@dataclasses.dataclass(frozen=True)
class Phase:
    """A declared progress phase (a title, optionally with a longer explanation)."""

    title: str
    detail: str | None = None


@dataclasses.dataclass(frozen=True)
class Meta:
    """What a factory declares: the arguments of :func:`factory`, checked."""

    name: str
    description: str
    phases: tuple[Phase, ...] = ()
    max_concurrent_subagents: int | None = None
    max_total_subagents: int | None = None
    timeout_seconds: float | None = None
    max_ai_credits: float | None = None
    args_schema: dict[str, Any] | None = None
    args_type: Any = None
    agent_max_turns: int | None = None
    agent_max_duration_seconds: float | None = None
    agent_wrap_up: str | None = None


def _soft_limits(where: str, max_turns: Any, max_duration_seconds: Any, wrap_up: Any) -> None:
    """Check per-agent soft limits (the host checks them again): raises ``ValueError`` or
    ``TypeError`` naming the bad one."""
    if max_turns is not None:
        if isinstance(max_turns, bool) or not isinstance(max_turns, int):
            raise TypeError(f"{where}: max_turns must be an int, got {max_turns!r}")
        if not 1 <= max_turns <= 0xFFFFFFFF:
            raise ValueError(f"{where}: max_turns must be a positive integer, got {max_turns}")
    if max_duration_seconds is not None:
        if isinstance(max_duration_seconds, bool) or not isinstance(max_duration_seconds, (int, float)):
            raise TypeError(f"{where}: max_duration_seconds must be a number, got {max_duration_seconds!r}")
        d = float(max_duration_seconds)
        if not (d > 0 and d <= 2147483.647):
            raise ValueError(f"{where}: max_duration_seconds must be positive seconds, at most 2147483.647, got {d}")
    if wrap_up is not None and (not isinstance(wrap_up, str) or not wrap_up.strip()):
        raise ValueError(f"{where}: wrap_up must be a non-empty string, got {wrap_up!r}")


_REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def _tuning(agent: Any, reasoning_effort: Any, context_tier: Any) -> None:
    """Check ``ctx.agent``'s tuning (the host checks it again)."""
    for name, value in (("agent", agent), ("reasoning_effort", reasoning_effort), ("context_tier", context_tier)):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"ctx.agent: {name} must be a non-empty string, got {value!r}")
    if reasoning_effort is not None and reasoning_effort not in _REASONING_EFFORTS:
        raise ValueError(f"ctx.agent: reasoning_effort must be one of {', '.join(_REASONING_EFFORTS)}, got {reasoning_effort!r}")


def _wit_limits(max_turns: int | None, max_duration_seconds: float | None, wrap_up: str | None) -> Any:
    return _wit.AgentLimits(
        max_turns=max_turns,
        max_duration_seconds=None if max_duration_seconds is None else float(max_duration_seconds),
        wrap_up=wrap_up,
    )


def schema_of(tp: Any) -> dict[str, Any]:
    """The JSON Schema (the host's structural subset) of a type: ``str``, ``int``, ``list[T]``,
    ``Optional[T]``, ``Literal``, a dataclass or ``TypedDict``... A dict is returned as is."""
    return _schema.schema_of(tp)


_REGISTERED: list[tuple[Meta, Callable[[Ctx[Any]], Awaitable[Any]]]] = []


def factory(
    *,
    name: str,
    description: str,
    phases: Sequence[str | Phase | tuple[str, str]] = (),
    max_concurrent_subagents: int | None = None,
    max_total_subagents: int | None = None,
    timeout_seconds: float | None = None,
    max_ai_credits: float | None = None,
    args: Any = None,
    agent_max_turns: int | None = None,
    agent_max_duration_seconds: float | None = None,
    agent_wrap_up: str | None = None,
) -> Callable[[Callable[[Ctx[Any]], Awaitable[T]]], Callable[[Ctx[Any]], Awaitable[T]]]:
    """Declare the factory: decorate its ``async def run(ctx)``.

    ``name`` is its stable identifier; ``description`` should state the shape of ``args``.
    ``phases`` are titles (or :class:`Phase`, or ``(title, detail)`` pairs) in order. The
    limits may each be overridden per invocation; absent means no limit of that kind.

    ``agent_max_turns``, ``agent_max_duration_seconds`` and ``agent_wrap_up`` are the default
    soft limits of every :meth:`Ctx.agent` call (a call's own win, one by one).

    ``args`` declares the arguments: a JSON Schema dict (the host checks the arguments
    against it before the run starts; ``ctx.args`` is the parsed JSON), or a dataclass /
    ``TypedDict`` (its schema is derived, and ``ctx.args`` is an instance of it).

    ``run`` returns the result: any JSON value (dataclasses are converted); ``None`` completes
    the run with no result. An exception ends the attempt with status ``error`` and the last
    frames of its traceback.
    """
    _soft_limits("@factory", agent_max_turns, agent_max_duration_seconds, agent_wrap_up)
    decls: list[Phase] = []
    for p in phases:
        if isinstance(p, Phase):
            decls.append(p)
        elif isinstance(p, tuple):
            decls.append(Phase(p[0], p[1]))
        else:
            decls.append(Phase(str(p)))
    schema: dict[str, Any] | None
    args_type: Any = None
    if args is None:
        schema = None
    elif isinstance(args, dict):
        schema = args
    else:
        schema = _schema.schema_of(args)
        args_type = args
    meta = Meta(
        name=name,
        description=description,
        phases=tuple(decls),
        max_concurrent_subagents=max_concurrent_subagents,
        max_total_subagents=max_total_subagents,
        timeout_seconds=timeout_seconds,
        max_ai_credits=max_ai_credits,
        args_schema=schema,
        args_type=args_type,
        agent_max_turns=agent_max_turns,
        agent_max_duration_seconds=agent_max_duration_seconds,
        agent_wrap_up=agent_wrap_up,
    )

    def register(run: Callable[[Ctx[Any]], Awaitable[T]]) -> Callable[[Ctx[Any]], Awaitable[T]]:
        if not inspect.iscoroutinefunction(run):
            raise TypeError(f"@factory decorates an `async def run(ctx)`, not {run!r}")
        _REGISTERED.append((meta, run))
        return run

    return register


# --------------------------------------------------------------------------- ctx


async def _resolve(value: Any) -> Any:
    """Await ``value`` if it is awaitable (sync and async producers alike)."""
    while inspect.isawaitable(value):
        value = await value
    return value


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class Ctx(Generic[A]):
    """The run's context: arguments, subagents, journal, progress, identity.

    One ``Ctx`` is passed to ``run``; share it with every coroutine of the run.
    """

    def __init__(self, args: A, args_json: str) -> None:
        self._args = args
        self._args_json = args_json

    # -- identity and progress

    @property
    def args(self) -> A:
        """The run's arguments: the parsed JSON (``{}`` when the caller gave none), or an
        instance of the dataclass / ``TypedDict`` given as ``@factory(args=...)``."""
        return self._args

    @property
    def args_json(self) -> str:
        """The arguments as JSON text."""
        return self._args_json

    @property
    def run_id(self) -> str:
        """The run's id, stable across resumed attempts."""
        _require_host()
        return cast(str, _hooks.run_id())

    def phase(self, title: str) -> None:
        """Start a named progress phase (run-global: call it between fan-outs)."""
        _require_host()
        _hooks.phase(title)

    def log(self, message: str) -> None:
        """Append one progress line to the run's log."""
        _require_host()
        _hooks.log(str(message))

    def cancelled(self) -> bool:
        """True once the run has been asked to stop (long loops may poll it; the host stops
        the run regardless)."""
        _require_host()
        return bool(_hooks.cancelled())

    def pause(self, key: str) -> Any:
        """A durable one-shot checkpoint named ``key``. The first attempt that reaches it
        pauses the run there: it raises :class:`Abort` (reason ``"paused"``; let it propagate)
        and the run ends ``paused``, waiting at ``key``. Once a caller resumes it (``factory
        resume RUN --input JSON``) the body runs again from the top (journaled steps and agent
        calls replay) and this returns the resume's input, parsed (``None`` when it carried
        none); every later attempt gets the same answer. Call it from the main flow: inside
        ``parallel`` or ``pipeline`` it raises :class:`FactoryError` (an ordinary failure)."""
        _require_host()
        if _concurrent_calls > 0:
            raise FactoryError(
                f"ctx.pause({key!r}) is refused inside parallel or pipeline: a checkpoint belongs to the body's main flow"
            )
        try:
            answer = _hooks.pause(key)
        except _Err as e:
            raise _abort_from_wit(e.value) from None
        return None if answer is None else json.loads(answer)

    async def sleep(self, ms: int) -> None:
        """Sleep ``ms`` milliseconds (counts as active time). Use it instead of
        ``asyncio.sleep``, which has no timer inside the component."""
        _require_host()
        await _agents.sleep(max(0, int(ms)))

    # -- subagents

    @overload
    async def agent(
        self,
        prompt: str,
        *,
        label: str | None = None,
        schema: None = None,
        model: str | None = None,
        max_turns: int | None = None,
        max_duration_seconds: float | None = None,
        wrap_up: str | None = None,
        agent: str | None = None,
        reasoning_effort: str | None = None,
        context_tier: str | None = None,
    ) -> str | None: ...

    @overload
    async def agent(
        self,
        prompt: str,
        *,
        label: str | None = None,
        schema: type[T],
        model: str | None = None,
        max_turns: int | None = None,
        max_duration_seconds: float | None = None,
        wrap_up: str | None = None,
        agent: str | None = None,
        reasoning_effort: str | None = None,
        context_tier: str | None = None,
    ) -> T | None: ...

    @overload
    async def agent(
        self,
        prompt: str,
        *,
        label: str | None = None,
        schema: dict[str, Any],
        model: str | None = None,
        max_turns: int | None = None,
        max_duration_seconds: float | None = None,
        wrap_up: str | None = None,
        agent: str | None = None,
        reasoning_effort: str | None = None,
        context_tier: str | None = None,
    ) -> Json | None: ...

    async def agent(
        self,
        prompt: str,
        *,
        label: str | None = None,
        schema: Any = None,
        model: str | None = None,
        max_turns: int | None = None,
        max_duration_seconds: float | None = None,
        wrap_up: str | None = None,
        agent: str | None = None,
        reasoning_effort: str | None = None,
        context_tier: str | None = None,
    ) -> Any:
        """Run one subagent and return its reply.

        Without ``schema``: the reply text. With a JSON Schema dict: the parsed JSON value,
        checked by the host against it (one retry on a parse or match failure; both spawns
        count). With a type (dataclass, ``TypedDict``, ``list[str]``...): its schema is
        derived and the reply is converted to it.

        Returns ``None`` on an ordinary failure (the subagent errored, replied nothing, or
        still failed the schema after its retry). Raises :class:`Abort` when the run must
        stop. Identical calls (prompt, label, schema, model, soft limits) are one subagent,
        even when concurrent: give independent subagents distinct labels.

        Soft limits (each falls back to the factory's ``agent_*`` default): ``max_turns``
        model turns, ``max_duration_seconds`` of wall time, and the ``wrap_up`` prompt sent
        when that time is up. Reaching one ends this call (with what the subagent answered by
        then, else ``None``), never the run.

        Tuning (part of the call's identity): ``agent`` (the persona, where the backend has
        one: an agent CLI's ``--agent``), ``reasoning_effort`` (``none``, ``minimal``, ``low``,
        ``medium``, ``high`` or ``xhigh``: OpenAI's ``reasoning_effort``, Anthropic's thinking
        budget) and ``context_tier`` (accepted, mapped by no backend today).
        """
        _require_host()
        _soft_limits("ctx.agent", max_turns, max_duration_seconds, wrap_up)
        _tuning(agent, reasoning_effort, context_tier)
        schema_json: str | None = None
        target: Any = None
        if schema is not None:
            schema_json = json.dumps(_schema.schema_of(schema), sort_keys=True)
            target = None if isinstance(schema, dict) else schema
        options = _wit.AgentOptions(
            label=label,
            schema=schema_json,
            model=model,
            limits=_wit_limits(max_turns, max_duration_seconds, wrap_up),
            agent=agent,
            reasoning_effort=reasoning_effort,
            context_tier=context_tier,
        )
        try:
            # One synchronous hook call: a memo hit (a replayed or repeated call), or a call
            # the host answered at once, comes back with its reply; any other call is started
            # and its outcome comes from the one `agent-wait` in flight (`_WAITING`).
            started = _agents.agent_start(str(prompt), options)
        except _Err as e:
            raise _abort_from_wit(e.value) from None
        if type(started).__name__ == "Started_Reply":
            reply = started.value
        else:
            reply = await _WAITING.outcome(started.value)
        if reply is None:
            return None
        try:
            value = json.loads(reply)
        except ValueError:
            return None if schema is not None else reply
        if schema is None:
            return value if isinstance(value, str) else reply
        if target is None:
            return value
        try:
            return _schema.convert(target, value)
        except (TypeError, ValueError):
            return None

    # -- journal

    async def step(
        self,
        key: str,
        producer: Callable[[], T | Awaitable[T]],
        *,
        volatile: bool = False,
    ) -> T:
        """A journaled step: the JSON value ``producer()`` returns is stored under ``key``;
        on a resume the stored value is returned without calling ``producer``.

        ``producer`` may be sync or async. The value must be JSON (dataclasses are
        converted); the result is always the JSON round-trip of it, the same on the first run
        and on a resume. The key is the step's sole identity: version it (``"scan-v2"``) when
        the producer's meaning changes. Producers may re-run after a crash: keep them
        idempotent. ``volatile=True`` bypasses the journal and calls ``producer`` every time.
        """
        _require_host()
        if volatile:
            return cast(T, await _resolve(producer()))
        try:
            stored = _hooks.step_get(key)
        except _Err as e:
            raise _abort_from_wit(e.value) from None
        if stored is not None:
            return cast(T, json.loads(stored))
        value = await _resolve(producer())
        try:
            text = json.dumps(value, default=_schema.to_json_value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise StepError(key, f"the value is not JSON: {e}") from None
        try:
            _hooks.step_put(key, text)
        except _Err as e:
            err = e.value
            if type(err).__name__ == "StepError_Abort":
                raise _abort_from_wit(err.value) from None
            raise StepError(key, str(getattr(err, "value", err))) from None
        return cast(T, json.loads(text))

    # -- combinators

    async def parallel(self, thunks: Iterable[Callable[[], Awaitable[T]] | Awaitable[T]]) -> list[T | None]:
        """Run every item concurrently and wait for all of them (a barrier).

        Items are thunks (``lambda: ctx.agent(...)``) or coroutines (``ctx.agent(...)``:
        coroutines are lazy, so both start here). Returns one entry per item, in order: its
        value, or ``None`` where the item raised an ordinary exception (logged). An
        :class:`Abort` from any item fails the whole call. More than :data:`MAX_ITEMS` items
        are refused (:class:`FactoryError`) before any runs.
        """
        items = list(thunks)
        if len(items) > MAX_ITEMS:
            _close(items)
            raise FactoryError(f"too many items: {len(items)} (at most {MAX_ITEMS} per call)")

        async def one(index: int, item: Any) -> Any:
            try:
                return await _resolve(item() if callable(item) else item)
            except Exception as e:  # noqa: BLE001 - an ordinary failure becomes None
                self._item_failed("parallel", index, e)
                return None

        return await _concurrently([one(i, item) for i, item in enumerate(items)])

    async def pipeline(self, items: Iterable[Any], *stages: Callable[[Any, Any, int], Any]) -> list[Any]:
        """Flow each item through ``stages`` with no barrier between stages.

        Every stage is called as ``stage(previous, item, index)`` (sync or async); the first
        stage's ``previous`` is the item itself. Returns one entry per item, in order: the
        last stage's value, or ``None`` where a stage raised an ordinary exception (that item
        skips its later stages). An :class:`Abort` fails the whole pipeline. More than
        :data:`MAX_ITEMS` items are refused.
        """
        values = list(items)
        if len(values) > MAX_ITEMS:
            raise FactoryError(f"too many items: {len(values)} (at most {MAX_ITEMS} per call)")

        async def flow(index: int, item: Any) -> Any:
            previous = item
            for number, stage in enumerate(stages):
                try:
                    previous = await _resolve(stage(previous, item, index))
                except Exception as e:  # noqa: BLE001 - an ordinary failure becomes None
                    self._item_failed(f"pipeline stage {number + 1}", index, e)
                    return None
            return previous

        return await _concurrently([flow(i, item) for i, item in enumerate(values)])

    def _item_failed(self, where: str, index: int, error: BaseException) -> None:
        if _hooks is not None:
            _hooks.log(f"{where}: item {index} failed: {_describe(error)}")


# `parallel`/`pipeline` calls in flight: `Ctx.pause` is refused while any is.
_concurrent_calls = 0


async def _concurrently(coroutines: list[Any]) -> list[Any]:
    """``_gather`` them, counted as a `parallel`/`pipeline` call in flight meanwhile."""
    global _concurrent_calls
    _concurrent_calls += 1
    try:
        return await _gather(coroutines)
    finally:
        _concurrent_calls -= 1


class _Waiting:
    """The calls ``agents.agent-start`` left pending, each an asyncio future by the host's id,
    and the one ``agents.agent-wait`` in flight that reports them: a pump that runs while any
    started call is unreported (kept alive with the component's task, so the task never ends
    with a wait in flight) and hands each outcome to its future, many per wait. A caller that
    stopped waiting (its future cancelled) leaves its call to run to its end; its outcome is
    dropped."""

    def __init__(self) -> None:
        self.calls: dict[int, Any] = {}
        self.pumping = False

    async def outcome(self, call: int) -> str | None:
        """The reply of started call ``call`` (``None``: an ordinary failure), or its
        :class:`Abort`."""
        import asyncio

        future = asyncio.get_running_loop().create_future()
        self.calls[call] = future
        if not self.pumping:
            self.pumping = True
            if _spawn is not None:
                _spawn(self._pump())
            else:
                asyncio.get_running_loop().create_task(self._pump())
        return cast("str | None", await future)

    async def _pump(self) -> None:
        try:
            while self.calls:
                finished = await _agents.agent_wait()
                if not finished:
                    # Only a broken host reports nothing pending while calls are: they fail.
                    error = FactoryError(f"agent-wait: the host reports no pending call, {len(self.calls)} are waiting")
                    for future in self.calls.values():
                        if not future.done():
                            future.set_exception(error)
                    self.calls.clear()
                    return
                for done in finished:
                    future = self.calls.pop(done.call, None)
                    if future is None or future.done():
                        continue
                    if isinstance(done.outcome, _Err):
                        future.set_exception(_abort_from_wit(done.outcome.value))
                    else:
                        future.set_result(done.outcome.value)
        except BaseException:
            # Torn down with its event loop: the futures went with it.
            self.calls.clear()
            raise
        finally:
            self.pumping = False


_WAITING = _Waiting()


def _close(items: list[Any]) -> None:
    """Close refused coroutines so Python does not warn that they were never awaited."""
    for item in items:
        if inspect.iscoroutine(item):
            item.close()


async def _gather(coroutines: list[Any]) -> list[Any]:
    """Run ``coroutines`` concurrently; the first :class:`Abort` fails the call at once (the
    others are left to the host, which stops them with the run)."""
    import asyncio

    if not coroutines:
        return []
    return list(await asyncio.gather(*coroutines))


# --------------------------------------------------------------------------- export


def _registered() -> tuple[Meta, Callable[[Ctx[Any]], Awaitable[Any]]]:
    if not _REGISTERED:
        raise RuntimeError("no factory: decorate `async def run(ctx)` with @factory(...)")
    if len(_REGISTERED) > 1:
        names = ", ".join(m.name for m, _ in _REGISTERED)
        raise RuntimeError(f"more than one @factory in one component: {names}")
    return _REGISTERED[0]
