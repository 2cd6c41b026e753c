"""The component's exports (``meta`` and ``run``) for the factory registered with
``@factory``. ``factory build`` generates the entry module that imports the user's module
and then this one; nothing here is meant to be used directly."""

from __future__ import annotations

import json
import linecache
import sys
import traceback
from typing import Any

import wit_world
from componentize_py_types import Err
from wit_world.imports import types as _wit

from . import Abort, Ctx, FactoryError, _describe, _registered, _schema, _wit_limits

#: Where ``factory build`` puts the user's sources inside the component (``-p`` index 1);
#: shown relative to their project in tracebacks.
USER_ROOT = "/1/"
#: The SDK and the entry module (``-p`` index 0).
SDK_ROOT = "/0/"
#: Frames of a traceback shown in an error.
TRACEBACK_FRAMES = 6


def _shown(filename: str) -> str:
    if filename.startswith(USER_ROOT):
        return filename[len(USER_ROOT) :]
    return filename


def prime_linecache() -> None:
    """Keep the user's source lines (read at build time) for tracebacks: the sandbox has no
    files at run time. An entry with no mtime is never re-checked against the disk."""
    for module in list(sys.modules.values()):
        filename = getattr(module, "__file__", None)
        if not isinstance(filename, str) or not filename.startswith(USER_ROOT):
            continue
        lines = linecache.getlines(filename)
        if lines:
            linecache.cache[filename] = (sum(len(line) for line in lines), None, lines, filename)


def format_exception(error: BaseException) -> str:
    """The exception and the last frames of its traceback, user frames first-class: frames of
    the SDK and of asyncio are left out, and the user's files are shown by their path in
    their project."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(USER_ROOT)]
    if not frames:
        frames = list(traceback.extract_tb(error.__traceback__))
    frames = frames[-TRACEBACK_FRAMES:]
    lines = [f"{_describe(error)}", "Traceback (most recent call last):"]
    for frame in frames:
        lines.append(f'  File "{_shown(frame.filename)}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            lines.append(f"    {frame.line.strip()}")
    lines.append(_describe(error))
    return "\n".join(lines)


def _args(meta: Any, args_json: str) -> Any:
    try:
        value = json.loads(args_json)
    except ValueError as e:
        raise FactoryError(f"invalid args: {e}") from None
    if meta.args_type is None:
        return value
    try:
        return _schema.convert(meta.args_type, value)
    except (TypeError, ValueError) as e:
        raise FactoryError(f"invalid args: {e}") from None


class WitWorld(wit_world.WitWorld):
    """The exports of the ``agent:factory/factory`` world."""

    def meta(self) -> _wit.Meta:
        meta, _ = _registered()
        return _wit.Meta(
            name=meta.name,
            description=meta.description,
            phases=[_wit.PhaseDecl(title=p.title, detail=p.detail) for p in meta.phases],
            limits=_wit.Limits(
                max_concurrent_subagents=meta.max_concurrent_subagents,
                max_total_subagents=meta.max_total_subagents,
                timeout_seconds=None if meta.timeout_seconds is None else float(meta.timeout_seconds),
                max_ai_credits=None if meta.max_ai_credits is None else float(meta.max_ai_credits),
            ),
            args_schema=None if meta.args_schema is None else json.dumps(meta.args_schema, sort_keys=True),
            agent_limits=_wit_limits(meta.agent_max_turns, meta.agent_max_duration_seconds, meta.agent_wrap_up),
        )

    async def run(self, args: str) -> str | None:
        try:
            meta, run = _registered()
            ctx: Ctx[Any] = Ctx(_args(meta, args), args)
            result = await run(ctx)
            if result is None:
                return None
            try:
                return json.dumps(result, default=_schema.to_json_value, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise FactoryError(f"the factory's result is not JSON: {e}") from None
        except Abort as e:
            # The host has recorded the real cause; it wins over this message.
            raise Err(str(e)) from None
        except BaseException as e:  # noqa: BLE001 - any exception ends the attempt with `error`
            raise Err(format_exception(e)) from None
