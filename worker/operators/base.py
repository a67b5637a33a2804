"""The operator contract, shared by every operator in a chain."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import pyarrow as pa

from yarnflow.common.errors import YarnflowError
from yarnflow.worker.runtime.elements import Watermark


class UserFunctionError(YarnflowError):
    """A user function raised; the message names the operator, the cause is chained."""


@dataclass
class RuntimeContext:
    """What an operator may know about the subtask it runs in."""

    job_id: str
    task_name: str
    subtask_index: int
    parallelism: int
    max_parallelism: int
    attempt_number: int
    runtime_mode: str = "STREAMING"
    job_storage_dir: str = ""
    config: dict[str, str] = field(default_factory=dict)
    batch_size: int = 65536

    @property
    def is_batch(self) -> bool:
        return self.runtime_mode == "BATCH"


class Output(Protocol):
    def collect(self, batch: pa.RecordBatch) -> None: ...

    def emit_watermark(self, watermark: Watermark) -> None: ...


class Operator:
    """Base of all operators. Lifecycle: setup -> open -> process_* -> end_input -> finish -> close.

    ``close`` runs whatever happened (also after a failure or a cancel); ``finish`` only after
    all input has been processed, and is where buffered results are emitted."""

    kind = "operator"

    def __init__(self, name: str | None = None, uid: str | None = None) -> None:
        self.name = name or self.kind
        self.uid = uid or ""
        self.ctx: RuntimeContext
        self.output: Output

    def setup(self, ctx: RuntimeContext, output: Output) -> None:
        self.ctx = ctx
        self.output = output

    def open(self) -> None:
        pass

    def process_batch(self, batch: pa.RecordBatch, input_index: int = 0) -> None:
        self.output.collect(batch)

    def process_watermark(self, watermark: Watermark, input_index: int = 0) -> None:
        self.output.emit_watermark(watermark)

    def end_input(self, input_index: int = 0) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass

    def call_user(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call a user function; its error is re-raised naming this operator."""
        try:
            return fn(*args)
        except Exception as exc:
            raise UserFunctionError(
                f"user function {getattr(fn, '__name__', fn)!s} in operator '{self.name}' "
                f"raised {type(exc).__name__}: {exc}") from exc

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class SourceOperator(Operator):
    """The head of a source chain: ``run`` emits batches into ``self.output`` until done."""

    kind = "source"
    bounded = True

    def run(self, cancelled: Callable[[], bool]) -> None:
        raise NotImplementedError
