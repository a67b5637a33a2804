"""The base of the wire messages (``messages.py``): a frozen dataclass converts itself to and
from its generated Thrift struct, driven by its field annotations (nested messages, lists,
maps, enums and typed ids)."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Callable, ClassVar, TypeVar

from yarnflow.common import ids

M = TypeVar("M", bound="Message")


def _convert_out(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_thrift()
    if isinstance(value, enum.Enum):
        return int(value.value)
    if isinstance(value, ids._Id):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_convert_out(v) for v in value]
    if isinstance(value, dict):
        return {_convert_out(k): _convert_out(v) for k, v in value.items()}
    return value


def _identity(value: Any) -> Any:
    return value


def _reader(tp: Any) -> Callable[[Any], Any]:
    """The function that turns a wire value of annotation ``tp`` into its Python value (None
    stays None), made once per field: the reading of every message runs through these."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return _reader([a for a in typing.get_args(tp) if a is not type(None)][0])
    if origin in (list, tuple):
        item = _reader(typing.get_args(tp)[0])
        if origin is tuple:
            return lambda v: None if v is None else tuple(item(x) for x in v)
        if item is _identity:
            return lambda v: None if v is None else list(v)
        return lambda v: None if v is None else [item(x) for x in v]
    if origin is dict:
        kt, vt = (_reader(a) for a in typing.get_args(tp))
        return lambda v: None if v is None else {kt(k): vt(x) for k, x in v.items()}
    if isinstance(tp, type):
        if issubclass(tp, Message):
            return lambda v: None if v is None else tp.from_thrift(v)
        if issubclass(tp, (enum.Enum, ids._Id)):
            return lambda v: None if v is None else tp(v)
    return _identity


#: per message class: (field name, reader, default, default factory) of each field
_FIELDS: dict[type, list[tuple[str, Callable[[Any], Any], Any, Any]]] = {}


def _fields(cls: type) -> list[tuple[str, Callable[[Any], Any], Any, Any]]:
    found = _FIELDS.get(cls)
    if found is None:  # resolving annotations is slow: once per class
        hints = typing.get_type_hints(cls)
        found = _FIELDS[cls] = [(f.name, _reader(hints[f.name]), f.default, f.default_factory)
                                for f in dataclasses.fields(cls)]
    return found


_MISSING = dataclasses.MISSING


class Message:
    """Base of the wire messages. Subclasses set ``_thrift`` to their generated struct."""

    _thrift: ClassVar[type]

    def to_thrift(self) -> Any:
        kwargs = {name: _convert_out(getattr(self, name)) for name, _, _, _ in _fields(type(self))}
        return self._thrift(**kwargs)

    @classmethod
    def from_thrift(cls: type[M], obj: Any) -> M:
        kwargs = {}
        for name, read, default, factory in _fields(cls):
            raw = getattr(obj, name)
            if raw is None and default is not _MISSING:
                kwargs[name] = default
            elif raw is None and factory is not _MISSING:
                kwargs[name] = factory()
            else:
                kwargs[name] = read(raw)
        return cls(**kwargs)
