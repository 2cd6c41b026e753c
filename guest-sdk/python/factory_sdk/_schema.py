"""JSON Schemas derived from Python types, and JSON values converted back to those types.

Covers what factories use for arguments and structured agent replies: ``str``, ``int``,
``float``, ``bool``, ``None``, ``list[T]``, ``tuple[T, ...]``, ``dict[str, T]``,
``Optional[T]`` / ``T | None``, ``Union``, ``Literal[...]``, ``Any``, dataclasses and
``TypedDict`` classes (nested freely). The schema is the host's structural subset
(``type``, ``properties``, ``required``, ``items``, ``enum``, ``anyOf``), inlined (no ``$ref``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

JsonSchema = dict[str, Any]

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def _is_typed_dict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def _hints(tp: Any) -> dict[str, Any]:
    return typing.get_type_hints(tp)


def schema_of(tp: Any) -> JsonSchema:
    """The JSON Schema of ``tp`` (a dict is taken as a schema already)."""
    if isinstance(tp, dict):
        return tp
    return _schema(tp, depth=0)


def _schema(tp: Any, depth: int) -> JsonSchema:
    if depth > 32:
        raise TypeError("type nests too deeply (recursive type?) for a JSON Schema")
    if tp is Any or tp is object:
        return {}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin is Union or origin is types.UnionType:
        return {"anyOf": [_schema(a, depth + 1) for a in args]}
    if tp is list or tp is tuple:
        return {"type": "array"}
    if origin in (list, tuple, typing.Sequence, set, frozenset):
        item = args[0] if args else Any
        return {"type": "array", "items": _schema(item, depth + 1)}
    if tp is dict or origin is dict or origin is typing.Mapping:
        out: JsonSchema = {"type": "object"}
        return out
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        hints = _hints(tp)
        fields = dataclasses.fields(tp)
        required = [
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        return {
            "type": "object",
            "properties": {f.name: _schema(hints.get(f.name, Any), depth + 1) for f in fields},
            "required": required,
        }
    if _is_typed_dict(tp):
        hints = _hints(tp)
        return {
            "type": "object",
            "properties": {k: _schema(v, depth + 1) for k, v in hints.items()},
            "required": sorted(tp.__required_keys__),
        }
    raise TypeError(f"cannot derive a JSON Schema from {tp!r}")


def convert(tp: Any, value: Any) -> Any:
    """Convert the JSON ``value`` to ``tp`` (dataclasses are constructed, nested ones too).

    Raises ``TypeError``/``ValueError`` when the value does not fit.
    """
    if tp is Any or tp is object or isinstance(tp, dict):
        return value
    if tp in _SCALARS:
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if tp is int and isinstance(value, bool) or not isinstance(value, tp):
            raise TypeError(f"expected {_SCALARS[tp]}, got {type(value).__name__}")
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        if value not in args:
            raise ValueError(f"expected one of {list(args)!r}, got {value!r}")
        return value
    if origin is Union or origin is types.UnionType:
        for option in args:
            try:
                return convert(option, value)
            except (TypeError, ValueError):
                continue
        raise TypeError(f"{value!r} matches none of {tp!r}")
    if tp in (list, tuple, dict):
        if not isinstance(value, list if tp is not dict else dict):
            raise TypeError(f"expected {tp.__name__}, got {type(value).__name__}")
        return tp(value)
    if origin in (list, tuple, typing.Sequence, set, frozenset):
        if not isinstance(value, list):
            raise TypeError(f"expected an array, got {type(value).__name__}")
        item = args[0] if args else Any
        items = [convert(item, v) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict or origin is typing.Mapping:
        if not isinstance(value, dict):
            raise TypeError(f"expected an object, got {type(value).__name__}")
        item = args[1] if len(args) == 2 else Any
        return {k: convert(item, v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {type(value).__name__}")
        hints = _hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        kwargs = {k: convert(hints.get(k, Any), v) for k, v in value.items() if k in names}
        return tp(**kwargs)
    if _is_typed_dict(tp):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {type(value).__name__}")
        missing = [k for k in tp.__required_keys__ if k not in value]
        if missing:
            raise TypeError(f"missing required key(s) {sorted(missing)} for {tp.__name__}")
        hints = _hints(tp)
        return {k: convert(hints.get(k, Any), v) for k, v in value.items()}
    raise TypeError(f"cannot convert JSON to {tp!r}")


def to_json_value(value: Any) -> Any:
    """``json.dumps`` ``default=`` hook: dataclasses become objects, tuples/sets arrays."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
