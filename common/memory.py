"""Process-wide memory settings of the AppMaster and TaskExecutor processes.

Measured on the W1/W2 benchmarks (``bench/RESULTS.md``), a TaskExecutor's resident memory grew
by ~110 MB during a job while Arrow's own pool never held more than ~20 MB: the rest was
allocator retention (mimalloc's pages, glibc's per-thread arenas, one per Flight and reader
thread, each keeping what it freed) and pandas, which pyarrow imports the first time
``pa.array`` sees Python objects (~50 MB a process). So at start-up:

- Arrow allocates from ``process.memory.arrow-allocator`` (default ``system``: glibc's malloc,
  which returns freed memory; ``mimalloc`` / ``jemalloc`` are faster at some allocation
  patterns and keep more);
- glibc's malloc uses at most ``process.memory.malloc-arena-max`` arenas (0: glibc's default,
  8 per core) and gives freed memory at the top of the heap back above 128 KB;
- with ``process.memory.defer-pandas-import`` (default on), pyarrow's pandas integration is
  armed only when something imports pandas (user code, a pickled DataFrame): until then
  ``pa.array`` does not load pandas. One thing pyarrow decides once and for all, at its first
  conversion of Python objects, is whether pandas' ``NA`` / ``NaT`` scalars inside Python
  values are nulls: in a process where pandas was deferred they are not recognised (a row
  holding ``pd.NA`` fails to convert). A job that emits such values sets the option to false.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
from types import ModuleType
from typing import Any, Sequence

log = logging.getLogger(__name__)

ALLOCATORS = ("system", "mimalloc", "jemalloc")
_M_TRIM_THRESHOLD = -1
_M_ARENA_MAX = -8
_TRIM_THRESHOLD_BYTES = 128 * 1024


def configure_process_memory(arrow_allocator: str, malloc_arena_max: int, defer_pandas: bool) -> None:
    """Apply the settings above; call once, early, before the process starts threads."""
    _configure_malloc(malloc_arena_max)
    _configure_arrow_pool(arrow_allocator)
    if defer_pandas:
        defer_pandas_import()


def _configure_malloc(arena_max: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): nothing to tune
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if arena_max > 0:
        mallopt(_M_ARENA_MAX, arena_max)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)


def _configure_arrow_pool(name: str) -> None:
    import pyarrow as pa

    makers = {"system": pa.system_memory_pool, "mimalloc": pa.mimalloc_memory_pool,
              "jemalloc": pa.jemalloc_memory_pool}
    try:
        pool = makers[name]()
    except (KeyError, NotImplementedError, pa.ArrowException) as exc:  # jemalloc is not in every build
        log.warning("Arrow allocator %r is not available (%s); keeping %s", name, exc,
                    pa.default_memory_pool().backend_name)
        return
    pa.set_memory_pool(pool)


def defer_pandas_import() -> None:
    """Keep pyarrow from importing pandas until something else does (see the module docstring).

    pyarrow tries ``import pandas`` once, the first time it must tell whether a Python object is
    a pandas Series; a failed try leaves pandas support off and a later explicit use retries.
    So the first try is made now, with pandas hidden; a finder then waits for the first real
    import of pandas and turns pyarrow's pandas support on right after it: pandas objects only
    exist once pandas is imported, so pyarrow always recognises them."""
    if "pandas" in sys.modules or importlib.util.find_spec("pandas") is None:
        return
    import pyarrow.lib

    shim = getattr(pyarrow.lib, "_pandas_api", None)
    if shim is None:
        return
    hide = _HidePandas()
    sys.meta_path.insert(0, hide)
    try:
        shim.have_pandas  # noqa: B018 - the Cython layer's try
        pyarrow.lib.array([None, 1]).to_numpy(zero_copy_only=False)  # the C++ layer's (made once)
    finally:
        sys.meta_path.remove(hide)
    sys.meta_path.insert(0, _ArmPyarrowOnPandasImport(shim))


class _HidePandas(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError("pandas is hidden from pyarrow's first try", name=fullname)
        return None


class _ArmPyarrowOnPandasImport(importlib.abc.MetaPathFinder):
    """On the first ``import pandas``: let it load, then have pyarrow import it too."""

    def __init__(self, shim: Any) -> None:
        self._shim = shim
        self._lock = threading.Lock()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pandas":
            return None
        with self._lock:  # two task threads may import pandas at once: one arms pyarrow
            if self not in sys.meta_path:
                return None
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        shim, exec_module = self._shim, loader.exec_module

        def exec_then_arm(module: ModuleType) -> None:
            exec_module(module)
            try:
                shim.pd  # noqa: B018 - pyarrow imports pandas now (found in sys.modules)
            except ImportError:  # a pandas pyarrow does not support: it stays off, as without this
                log.debug("pyarrow does not use this pandas", exc_info=True)

        loader.exec_module = exec_then_arm  # type: ignore[method-assign]
        return spec
