"""Keyed state descriptors: a name and a kind (value, list, map, reducing), given to
``ctx.get_state(descriptor)`` in a KeyedProcessFunction. The state objects and the backend
that holds them are the TaskExecutor's (``yarnflow.worker.state``).

    YarnflowError
    └── StateError                              misuse of keyed state
        └── StateDescriptorError (ValueError)   a bad descriptor, or a name registered again
                                                with another kind

(The runtime adds the other StateErrors: no current key, key group out of range, restore.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from yarnflow.common.errors import YarnflowError

__all__ = [
    "ListStateDescriptor",
    "MapStateDescriptor",
    "ReducingStateDescriptor",
    "StateDescriptor",
    "StateDescriptorError",
    "StateError",
    "ValueStateDescriptor",
]


class StateError(YarnflowError):
    """Keyed state was used in a way it does not support; the message says how."""


class StateDescriptorError(StateError, ValueError):
    """A state name is empty, or was registered with a different kind than before. Use
    another name."""


@dataclass(frozen=True)
class StateDescriptor:
    name: str
    kind = "state"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise StateDescriptorError(f"a state name must be a non-empty string, got {self.name!r}")


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor):
    """One value per key. ``value()`` returns (a copy of) ``default`` for a key with no value."""

    default: Any = None
    kind = "value"


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor):
    """A list of values per key."""

    kind = "list"


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor):
    """A dict per key."""

    kind = "map"


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor):
    """One value per key, folded with ``reduce_fn(accumulated, new)`` on each ``add``."""

    reduce_fn: Callable[[Any, Any], Any] = field(default=None)  # type: ignore[assignment]
    kind = "reducing"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_fn):
            raise StateDescriptorError(f"reducing state {self.name!r} needs a callable reduce_fn, "
                                       f"got {self.reduce_fn!r}")
