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
  8 per core), takes blocks under 512 KB from its heap (larger ones are mappings of their own,
  returned when freed) and gives freed memory at the top of the heap back above 2 MB. Both are
  fixed: setting one stops glibc's own sliding of the other. With the mapping threshold left at
  the 128 KB glibc starts from, most Arrow buffers of a batch (a 65,536-row column is 0.2-1 MB)
  were new mappings whose pages were faulted in afresh: W2 ran at 8.2 M records/s instead of
  ~10-12. Above 512 KB the heap fragments: at 1 MB the cluster's peak on W2 with 20M records
  grew from ~480 to ~550 MB;
- with ``process.memory.defer-pandas-import`` (default off, experimental), pyarrow does not
  load pandas until something else imports it (user code, a pickled DataFrame); its Python-level
  pandas support is switched on right after that import. Its C++ layer is not: pyarrow (26 read)
  looks pandas up once per process, at the first type inference of any Python value (even
  ``import pyarrow.dataset`` makes one), and keeps the answer. So in a deferring process that
  later imports pandas, pandas scalars inside Python values convert as if pandas did not exist:
  ``pd.NA`` and ``pd.NaT`` are not nulls with ``from_pandas=True`` (``Table.from_pandas`` of an
  object column holding ``pd.NA`` fails), ``pd.DateOffset`` does not convert, and
  ``pd.Timestamp`` / ``pd.Timedelta`` lose their nanoseconds. A process logs a warning when
  this happens. Only jobs whose code never imports pandas should turn the option on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any, Sequence

log = logging.getLogger(__name__)

ALLOCATORS = ("system", "mimalloc", "jemalloc")
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD_BYTES = 512 << 10
_TRIM_THRESHOLD_BYTES = 2 << 20
_ARROW_POOL_VAR = "ARROW_DEFAULT_MEMORY_POOL"


def configure_process_memory(arrow_allocator: str, malloc_arena_max: int, defer_pandas: bool) -> None:
    """Apply the settings above; call once, early, before the process starts threads."""
    _configure_malloc(malloc_arena_max)
    _configure_arrow_pool(arrow_allocator)
    if defer_pandas:
        defer_pandas_import()


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    """The C library (None off Linux or when it cannot be loaded); looked up once: ``find_library``
    runs ``ldconfig`` in a subprocess."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_free_memory() -> None:
    """Give memory freed by Python, Arrow and glibc back to the system (the memory watchdog calls
    it after failing tasks): a garbage collection, Arrow's pool's unused memory, glibc's
    ``malloc_trim``."""
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    trim = getattr(_libc(), "malloc_trim", None)  # not glibc: nothing more to do
    if trim is not None:
        trim(0)


def _configure_malloc(arena_max: int) -> None:
    libc = _libc()
    try:
        mallopt = libc.mallopt
    except AttributeError:  # no libc, or not glibc (musl has no mallopt): nothing to tune
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if arena_max > 0:
        mallopt(_M_ARENA_MAX, arena_max)
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)


def _configure_arrow_pool(name: str) -> None:
    """Arrow's Python layer allocates from the pool ``pa.set_memory_pool`` names; its C++ layer
    (Acero's group-by, Flight, the Parquet reader's internals) from the pool that
    ``ARROW_DEFAULT_MEMORY_POOL`` named when pyarrow was loaded, which ``set_memory_pool`` does
    not change. Both are set here: the variable while pyarrow is not loaded yet (an entry point
    applies its settings before any import of pyarrow), the Python layer's pool always."""
    if "pyarrow" not in sys.modules:
        os.environ[_ARROW_POOL_VAR] = name
    import pyarrow as pa

    internal = pa.default_memory_pool().backend_name  # the C++ layer's, unless set before
    makers = {"system": pa.system_memory_pool, "mimalloc": pa.mimalloc_memory_pool,
              "jemalloc": pa.jemalloc_memory_pool}
    try:
        pool = makers[name]()
    except (KeyError, NotImplementedError, pa.ArrowException) as exc:  # jemalloc is not in every build
        log.warning("Arrow allocator %r is not available (%s); keeping %s", name, exc, internal)
        return
    pa.set_memory_pool(pool)
    if internal != name:
        log.warning("pyarrow was loaded before process.memory.arrow-allocator was applied: Arrow's C++ "
                    "layer (group-by, Flight, Parquet) keeps allocating from %s, its Python layer from %s",
                    internal, name)


def warm_pandas_support() -> threading.Thread | None:
    """Have pyarrow load pandas now, on a thread of its own, rather than in the first task's first
    ``pa.array`` (~0.3 s of CPU in each process, ~0.14 s of a small job's submit-to-result time on
    a fresh cluster): a TaskExecutor calls it as it starts, so the import overlaps its registration
    and the job's scheduling. Not called with ``process.memory.defer-pandas-import``; nothing when
    pandas is not installed or already loaded. The memory is the same as a first ``pa.array``'s."""
    if "pandas" in sys.modules or importlib.util.find_spec("pandas") is None:
        return None

    def warm() -> None:
        import pyarrow.lib

        try:
            shim = getattr(pyarrow.lib, "_pandas_api", None)
            if shim is not None and not shim.have_pandas:  # the Cython layer's try (below, the C++ layer's)
                return
            pyarrow.lib.array([None, 1]).to_numpy(zero_copy_only=False)
        except Exception:  # noqa: BLE001 - a pandas pyarrow cannot use: the first pa.array says so
            log.debug("warming pyarrow's pandas support failed", exc_info=True)

    thread = threading.Thread(target=warm, name="warm-pandas", daemon=True)
    thread.start()
    return thread


def defer_pandas_import() -> None:
    """Keep pyarrow from importing pandas until something else does (see the module docstring).

    pyarrow's Cython layer tries ``import pandas`` once, the first time it must tell whether a
    Python object is a pandas Series, and its C++ layer once, at its first type inference; a
    failed try leaves pandas support off. Both tries are made now, with pandas hidden. A
    post-import hook (wrapt's) turns the Cython layer's support on right after the first real
    import of pandas, wherever it comes from."""
    if "pandas" in sys.modules or importlib.util.find_spec("pandas") is None:
        return
    import pyarrow.lib
    import wrapt

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
    wrapt.register_post_import_hook(functools.partial(_arm_pyarrow, shim), "pandas")


class _HidePandas(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError("pandas is hidden from pyarrow's first try", name=fullname)
        return None


def _arm_pyarrow(shim: Any, pandas: ModuleType) -> None:
    """pandas was just imported in a process that deferred it: pyarrow's Python-level support
    goes on (pandas Series, DataFrames, ``to_pandas``), its C++ layer stays without it."""
    del pandas
    try:
        shim.pd  # noqa: B018 - pyarrow imports pandas now (found in sys.modules)
    except ImportError:  # a pandas pyarrow does not support: it stays off, as without deferral
        log.debug("pyarrow does not use this pandas", exc_info=True)
    log.warning("pandas was imported in a process started with process.memory.defer-pandas-import: "
                "pyarrow converts pd.NA, pd.NaT, pd.DateOffset and the nanoseconds of pd.Timestamp / "
                "pd.Timedelta inside Python values as if pandas were absent; set the option to false "
                "for jobs that use pandas")
