"""The runtime's keyed-state errors. The root and the user-facing descriptor error are user API
(``yarnflow.common.api.state``)::

    YarnflowError
    └── StateError                               misuse of keyed state
        ├── StateDescriptorError (ValueError)    a name registered again with another kind
        ├── NoCurrentKeyError (RuntimeError)     state used outside a keyed context
        ├── KeyGroupOutOfRangeError (ValueError) a key that this backend does not own
        └── StateRestoreError (ValueError)       a snapshot that cannot be restored here
"""

from __future__ import annotations

from yarnflow.common.api.state import StateDescriptorError, StateError

__all__ = ["KeyGroupOutOfRangeError", "NoCurrentKeyError", "StateDescriptorError", "StateError",
           "StateRestoreError"]


class NoCurrentKeyError(StateError, RuntimeError):
    """Keyed state was read or written with no current key (e.g. from ``open``)."""


class KeyGroupOutOfRangeError(StateError, ValueError):
    """A key's key group is not owned by this backend: the input was not partitioned by the
    same keys and max parallelism as the operator."""


class StateRestoreError(StateError, ValueError):
    """A snapshot does not fit this operator (a missing column, another kind for a state name,
    an entry restored twice). The restore fails; the checkpoint is then treated as unreadable."""
