"""The project's exceptions: one root, each also inheriting the matching builtin so callers
can catch either.

    YarnflowError
    ├── ConfigurationError (ValueError)       a bad or unknown configuration key or value
    ├── JobDefinitionError (ValueError)       a pipeline that cannot be compiled
    ├── RpcError                              anything that went wrong in a remote call
    │   ├── RpcConnectionError (ConnectionError)  the peer cannot be reached / went away
    │   │   └── PartitionNotFoundError            (worker.network.flight) a producer does not serve
    │   │                                         the partition a consumer asked for
    │   ├── RpcTimeoutError (TimeoutError)        the peer did not answer in time
    │   ├── FencingTokenError                     the call carried a stale fencing token
    │   ├── NotFoundError (LookupError)           unknown job, task or allocation
    │   ├── InvalidRequestError (ValueError)      the remote side rejected the request as bad
    │   ├── UnavailableError                      the remote side is not ready / shutting down
    │   │   └── NotLeaderRpcError                     a standby AppMaster answered: ask the leader
    │   └── RefusedError                          valid request that was declined
    ├── HighAvailabilityError                 the high-availability services failed (common/ha)
    │   ├── NotLeaderError                        a leader-only write by one that no longer leads
    │   └── CoordinationUnavailableError (ConnectionError)  ZooKeeper cannot be reached in time
    ├── SourceReadError (IOError)             an input path or file cannot be read (names it); crosses
    │                                         the wire as itself (the split enumerator's, to a source)
    ├── TaskError                             a task failed (carries the remote ErrorInfo)
    ├── JobFailedError                        a job ended FAILED (carries its cause)
    └── IllegalStateTransition (RuntimeError) a state machine was asked for a forbidden move
"""

from __future__ import annotations

from yarnflow.common.ids import ResultPartitionID


class YarnflowError(Exception):
    """Root of every exception raised by yarnflow."""


class ConfigurationError(YarnflowError, ValueError):
    """A configuration key is unknown or its value is bad. The message names the key."""


class JobDefinitionError(YarnflowError, ValueError):
    """The pipeline cannot be compiled into a JobGraph (no job defined, bad column, ...)."""


class SourceReadError(YarnflowError, IOError):
    """An input path or file could not be read; the message names it. Raised by the file
    sources' readers and by their split enumerator in the JobMaster, and passed to the source
    task that asked for a split as itself (``common.rpc.errors``), so the job fails saying so."""


class RpcError(YarnflowError):
    """A remote call failed. ``remote_traceback`` holds the peer's traceback when it sent one."""

    def __init__(self, message: str, remote_traceback: str | None = None) -> None:
        super().__init__(message)
        self.remote_traceback = remote_traceback


class RpcConnectionError(RpcError, ConnectionError):
    """The peer could not be reached or dropped the connection. Retry or give up.

    When the peer was the producer of a result partition that a consumer was reading,
    ``partition_id`` names that partition (None otherwise); a task failing with it reports the
    partition as unavailable (``ErrorInfo.unavailable_partition``) so the JobMaster can restart
    its producer."""

    def __init__(self, message: str, remote_traceback: str | None = None, *,
                 partition_id: str | None = None) -> None:
        super().__init__(message, remote_traceback)
        self.partition_id: ResultPartitionID | None = ResultPartitionID(partition_id) if partition_id else None


class RpcTimeoutError(RpcError, TimeoutError):
    """The peer did not answer within the call's timeout."""


class FencingTokenError(RpcError):
    """The call carried a stale fencing token: the caller talks to a deposed leader."""


class NotFoundError(RpcError, LookupError):
    """The remote side does not know the job / task / allocation named in the call."""


class InvalidRequestError(RpcError, ValueError):
    """The remote side rejected the request as malformed."""


class HighAvailabilityError(YarnflowError):
    """The high-availability services could not do what was asked (a store that cannot be
    read, a pointer to nothing). The message says what and where."""


class NotLeaderError(HighAvailabilityError):
    """A write that only the leader may make, by a contender that does not (or no longer)
    lead: it was refused, nothing changed. The caller stops acting as leader."""


class CoordinationUnavailableError(HighAvailabilityError, ConnectionError):
    """ZooKeeper (``high-availability.zookeeper.quorum``) could not be reached within the
    connection timeout. Check the quorum address and that the servers run."""


class UnavailableError(RpcError):
    """The remote side is not ready or is shutting down; retrying later may succeed."""


class NotLeaderRpcError(UnavailableError):
    """The AppMaster called does not lead the cluster (a standby, or one deposed): the call
    did nothing. Find the leader (ZooKeeper) and call it instead."""


class RefusedError(RpcError):
    """The request was valid but declined (e.g. the slot is already taken)."""


class TaskError(YarnflowError):
    """A task failed; ``error`` is the ErrorInfo reported by the TaskExecutor."""


class MemoryLimitError(YarnflowError):
    """A TaskExecutor came near the memory its container may use (``taskmanager.memory.process.size``):
    its watchdog failed its tasks before YARN's NodeManager would kill the container. The
    message says where the memory was (Arrow buffers, managed memory, the rest)."""


class JobFailedError(YarnflowError):
    """A job ended FAILED. ``cause`` is its root cause (ErrorInfo) when known."""

    def __init__(self, message: str, cause: object | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class RemoteTraceback(Exception):
    """The traceback of a failure in another process (a TaskExecutor's), set as the cause of the
    error raised here, so Python's own report of an uncaught error shows the user function's
    frames (the job file's name and line) before the client's (as multiprocessing does)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


class IllegalStateTransition(YarnflowError, RuntimeError):
    """A state machine was asked to move between two states that have no transition."""


class YarnError(YarnflowError):
    """YARN (through skein) refused or failed a request: no driver reachable, an unknown or
    ended application, a container larger than the cluster allows."""
