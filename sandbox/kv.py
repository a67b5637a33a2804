"""skein's key-value store, as its Java ApplicationMaster keeps it: sorted string keys with
bytes values and an optional owner (a service container, whose keys go when it ends), range
reads and deletes, conditional transactions, and watches that stream PUT/DELETE events over
key ranges. Requests and answers are skein's generated protobuf messages.

Ranges follow skein: ``start`` is inclusive (``""`` or ``"\\0"``: from the first key), ``end``
exclusive (``""``: to the last key), and a range with ``start > end`` is empty. A watch on
``[start, end)`` gets every PUT of a key in it (the new key, value and owner) and every DELETE
(the keys only) when its type asks for them.

Also home of the sandbox's errors (the lowest module: the others import it)::

    YarnflowError
    └── SandboxError                the sandbox cannot do what was asked
        └── RequestRejected         a call rejected as skein's Java side would; ``code`` names
                                    the gRPC status (INVALID_ARGUMENT, FAILED_PRECONDITION,
                                    ALREADY_EXISTS, INTERNAL), which skein's client turns into
                                    ValueError / KeyError / DriverError / ApplicationError

Thread safety: every method runs under the lock given to the constructor (the application
attempt's lock, shared with its containers so that owned keys and container ends stay
consistent). Watch events are handed to each stream's queue under that lock, in commit order;
the gRPC thread serving the stream drains the queue. No thread of its own.
"""

from __future__ import annotations

import bisect
import itertools
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Protocol

from skein.proto import skein_pb2 as proto

from yarnflow.common.errors import YarnflowError

__all__ = ["KeyValueStore", "Owners", "RequestRejected", "SandboxError", "WatchStream"]


class SandboxError(YarnflowError):
    """The YARN sandbox cannot do what was asked (it is stopped, a port is taken, ...)."""


class RequestRejected(SandboxError):
    """A request rejected the way skein's Java side rejects it; ``code`` is the name of the gRPC
    status code the servers answer with (skein's client maps it to an exception)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Owners(Protocol):
    """The containers keys may belong to (the application attempt)."""

    def check_owner(self, owner: proto.ContainerInstance) -> None:
        """Raise RequestRejected unless ``owner`` is a container that has not completed."""

    def add_owned_key(self, owner: proto.ContainerInstance, key: str) -> None: ...

    def remove_owned_key(self, owner: proto.ContainerInstance, key: str) -> None: ...


class _Watch:
    def __init__(self, watch_id: int, start: str, end: str, kind: int, stream: WatchStream) -> None:
        self.id = watch_id
        self.start = start
        self.end = end or None  # None: no upper bound
        self.put = kind in (proto.WatchCreateRequest.ALL, proto.WatchCreateRequest.PUT)
        self.delete = kind in (proto.WatchCreateRequest.ALL, proto.WatchCreateRequest.DELETE)
        self.stream = stream

    def covers(self, key: str) -> bool:
        return self.start <= key and (self.end is None or key < self.end)


class WatchStream:
    """One client's Watch call: ``request()`` takes its create/cancel requests (answered in
    order), iterating yields the responses and events, ``close()`` ends it and drops its
    watches. ``lost`` is True when it ended because the store closed (the attempt is over: the
    client must see the AppMaster gone, as when skein's Java AppMaster exits)."""

    def __init__(self, store: KeyValueStore) -> None:
        self._store = store
        self._queue: queue.Queue[proto.WatchResponse | None] = queue.Queue()
        self._ids: set[int] = set()
        self._closed = False
        self.lost = False

    def request(self, req: proto.WatchRequest) -> None:
        store = self._store
        with store.lock:
            if self._closed:
                return
            which = req.WhichOneof("request")
            if which == "create":
                watch_id = next(store._ids)
                create = req.create
                store._watches[watch_id] = _Watch(watch_id, create.start, create.end, create.event_type, self)
                self._ids.add(watch_id)
                self._queue.put(proto.WatchResponse(type=proto.WatchResponse.CREATE, watch_id=watch_id))
            elif which == "cancel":
                watch_id = req.cancel.watch_id
                if watch_id in self._ids:
                    self._ids.discard(watch_id)
                    store._watches.pop(watch_id, None)
                self._queue.put(proto.WatchResponse(type=proto.WatchResponse.CANCEL, watch_id=watch_id))

    def send(self, resp: proto.WatchResponse) -> None:
        if not self._closed:
            self._queue.put(resp)

    def close(self, lost: bool = False) -> None:
        with self._store.lock:
            if self._closed:
                return
            self._closed, self.lost = True, lost
            for watch_id in self._ids:
                self._store._watches.pop(watch_id, None)
            self._ids.clear()
            self._store._streams.discard(self)
        self._queue.put(None)

    def __iter__(self) -> Iterator[proto.WatchResponse]:
        while True:
            item = self._queue.get()
            if item is None:
                return
            yield item


class KeyValueStore:
    def __init__(self, lock: threading.RLock, owners: Owners) -> None:
        self.lock = lock
        self._owners = owners
        self._keys: list[str] = []  # sorted
        self._items: dict[str, proto.KeyValue] = {}
        self._watches: dict[int, _Watch] = {}
        self._streams: set[WatchStream] = set()
        self._ids = itertools.count(1)
        self._closed = False

    # ------------------------------------------------------------------ reads and writes

    def get_range(self, req: proto.GetRangeRequest) -> proto.GetRangeResponse:
        with self.lock:
            keys = self._select(req.start, req.end)
            resp = proto.GetRangeResponse(count=len(keys), result_type=req.result_type)
            if req.result_type == proto.GetRangeRequest.ITEMS:
                resp.result.extend(self._items[k] for k in keys)
            elif req.result_type == proto.GetRangeRequest.KEYS:
                resp.result.extend(proto.KeyValue(key=k) for k in keys)
            return resp

    def put_key(self, req: proto.PutKeyRequest) -> proto.PutKeyResponse:
        with self.lock:
            self._precheck_put(req)
            return self._put(req)

    def delete_range(self, req: proto.DeleteRangeRequest) -> proto.DeleteRangeResponse:
        with self.lock:
            keys = self._select(req.start, req.end)
            resp = proto.DeleteRangeResponse(count=len(keys), result_type=req.result_type)
            if not keys:
                return resp
            if req.result_type == proto.DeleteRangeRequest.ITEMS:
                resp.result.extend(self._items[k] for k in keys)
            elif req.result_type == proto.DeleteRangeRequest.KEYS:
                resp.result.extend(proto.KeyValue(key=k) for k in keys)
            for watch in list(self._watches.values()):
                if watch.delete:
                    hit = [k for k in keys if watch.covers(k)]
                    if hit:
                        watch.stream.send(proto.WatchResponse(type=proto.WatchResponse.DELETE, watch_id=watch.id,
                                                              event=[proto.KeyValue(key=k) for k in hit]))
            for key in keys:
                item = self._items.pop(key)
                if item.HasField("owner"):
                    self._owners.remove_owned_key(item.owner, key)
            lo = bisect.bisect_left(self._keys, keys[0])
            del self._keys[lo:lo + len(keys)]
            return resp

    def transaction(self, req: proto.TransactionRequest) -> proto.TransactionResponse:
        with self.lock:
            succeeded = all(self._holds(cond) for cond in req.condition)
            ops = req.on_success if succeeded else req.on_failure
            for op in ops:  # validate every write before committing any
                if op.WhichOneof("request") == "put_key":
                    self._precheck_put(op.put_key)
            resp = proto.TransactionResponse(succeeded=succeeded)
            for op in ops:
                which = op.WhichOneof("request")
                if which == "put_key":
                    resp.result.add(put_key=self._put(op.put_key))
                elif which == "get_range":
                    resp.result.add(get_range=self.get_range(op.get_range))
                elif which == "delete_range":
                    resp.result.add(delete_range=self.delete_range(op.delete_range))
            return resp

    def remove_owned(self, keys: Iterable[str]) -> None:
        """Delete the keys of a container that ended; watchers get a DELETE event per key."""
        with self.lock:
            for key in keys:
                item = self._items.pop(key, None)
                if item is None:
                    continue
                del self._keys[bisect.bisect_left(self._keys, key)]
                for watch in list(self._watches.values()):
                    if watch.delete and watch.covers(key):
                        watch.stream.send(proto.WatchResponse(type=proto.WatchResponse.DELETE, watch_id=watch.id,
                                                              event=[proto.KeyValue(key=key)]))

    # ------------------------------------------------------------------ watches

    def open_stream(self) -> WatchStream:
        with self.lock:
            stream = WatchStream(self)
            if self._closed:
                stream.close(lost=True)
            else:
                self._streams.add(stream)
            return stream

    def close(self) -> None:
        """End every watch stream, now and later (the application attempt is over)."""
        with self.lock:
            self._closed = True
            streams = list(self._streams)
        for stream in streams:
            stream.close(lost=True)

    # ------------------------------------------------------------------ internals

    def _select(self, start: str, end: str) -> list[str]:
        lo = 0 if start in ("", "\0") else bisect.bisect_left(self._keys, start)
        if not end:
            return self._keys[lo:]
        if start not in ("", "\0") and start > end:
            return []
        return self._keys[lo:bisect.bisect_left(self._keys, end)]

    def _precheck_put(self, req: proto.PutKeyRequest) -> None:
        if req.ignore_value and req.ignore_owner:
            raise RequestRejected("INVALID_ARGUMENT", "ignore_value & ignore_owner can't both be true")
        if req.ignore_value and req.key not in self._items:
            raise RequestRejected("FAILED_PRECONDITION", "ignore_value=True & key isn't already set")
        if not req.ignore_owner and req.HasField("owner"):
            self._owners.check_owner(req.owner)

    def _put(self, req: proto.PutKeyRequest) -> proto.PutKeyResponse:
        key = req.key
        prev = self._items.get(key)
        item = proto.KeyValue(key=key, value=prev.value if (req.ignore_value and prev is not None) else req.value)
        if req.ignore_owner:
            if prev is not None and prev.HasField("owner"):
                item.owner.CopyFrom(prev.owner)
        else:
            if prev is not None and prev.HasField("owner"):
                self._owners.remove_owned_key(prev.owner, key)
            if req.HasField("owner"):
                self._owners.add_owned_key(req.owner, key)
                item.owner.CopyFrom(req.owner)
        if prev is None:
            bisect.insort(self._keys, key)
        self._items[key] = item
        for watch in list(self._watches.values()):
            if watch.put and watch.covers(key):
                watch.stream.send(proto.WatchResponse(type=proto.WatchResponse.PUT, watch_id=watch.id, event=[item]))
        resp = proto.PutKeyResponse(return_previous=req.return_previous)
        if req.return_previous and prev is not None:
            resp.previous.CopyFrom(prev)
        return resp

    def _holds(self, cond: proto.Condition) -> bool:
        """skein's Condition: compare a key's value (bytes, compared as Java's signed bytes) or
        owner with the given one; a missing side only compares EQUAL / NOT_EQUAL."""
        item = self._items.get(cond.key)
        rhs = cond.WhichOneof("rhs")
        lhs_v: object
        rhs_v: object
        if cond.field == proto.Condition.VALUE:
            lhs_v = None if item is None else _signed(item.value)
            rhs_v = _signed(cond.value) if rhs == "value" else None
        else:
            lhs_v = (item.owner.service_name, item.owner.instance) if item is not None and item.HasField("owner") \
                else None
            rhs_v = (cond.owner.service_name, cond.owner.instance) if rhs == "owner" else None
        op = cond.operator
        if lhs_v is None or rhs_v is None:
            if op == proto.Condition.EQUAL:
                return lhs_v is None and rhs_v is None
            if op == proto.Condition.NOT_EQUAL:
                return not (lhs_v is None and rhs_v is None)
            return False
        compare = (lhs_v > rhs_v) - (lhs_v < rhs_v)  # type: ignore[operator]
        return {
            proto.Condition.EQUAL: compare == 0,
            proto.Condition.NOT_EQUAL: compare != 0,
            proto.Condition.LESS: compare < 0,
            proto.Condition.LESS_EQUAL: compare <= 0,
            proto.Condition.GREATER: compare > 0,
            proto.Condition.GREATER_EQUAL: compare >= 0,
        }[op]


def _signed(value: bytes) -> tuple[int, ...]:
    return tuple(b - 256 if b > 127 else b for b in value)
