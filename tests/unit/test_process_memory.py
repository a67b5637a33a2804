"""Process memory settings of AppMaster and TaskExecutor processes (common/memory.py): pyarrow
does not load pandas until a job's code does, and then recognises pandas objects as usual; the
Arrow allocator and malloc settings take effect. Each case runs in a fresh interpreter, since
these are process-wide and one-shot."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _run(code: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=50, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_pyarrow_conversions_do_not_load_pandas_until_user_code_imports_it():
    out = _run("""
        import sys
        import numpy as np
        import pyarrow as pa
        from yarnflow.common.memory import configure_process_memory
        configure_process_memory("system", 1, True)
        batch = pa.record_batch({"w": ["a", "b", None], "n": [1, None, 3]})
        batch.to_pylist(); batch.column(1).to_numpy(zero_copy_only=False)
        pa.RecordBatch.from_pylist([{"w": "x", "n": 1.5}]); pa.array(np.arange(3))
        print("pandas" in sys.modules)
        import pandas as pd  # the user's import: pyarrow's pandas support is on from here
        print(pa.array(pd.Series([1.0, np.nan])).null_count)  # from_pandas: NaN is null
        print(pa.Table.from_pandas(pd.DataFrame({"a": [1, 2]})).num_rows)
        print(pa.default_memory_pool().backend_name)
    """)
    assert out == ["False", "1", "2", "system"]


def test_a_pickled_dataframe_still_loads_and_converts():
    """A job's closure may hold a DataFrame: unpickling it imports pandas through pickle."""
    out = _run("""
        import pickle, subprocess, sys
        import numpy as np
        payload = subprocess.run([sys.executable, "-c", "import pickle, sys, pandas as pd; "
                                  "sys.stdout.buffer.write(pickle.dumps(pd.Series([1.0, float('nan')])))"],
                                 capture_output=True, check=True).stdout
        import pyarrow as pa
        from yarnflow.common.memory import defer_pandas_import
        defer_pandas_import()
        pa.array([1, 2])
        print("pandas" in sys.modules)
        series = pickle.loads(payload)
        print(pa.array(series).null_count)
    """)
    assert out == ["False", "1"]


def test_looking_for_pandas_before_importing_it_still_arms_pyarrow():
    """Key hashing looks pandas up (``find_spec``) without importing it; the user's later import
    must still switch pyarrow's pandas support on (it stayed off: NaN in a Series was not null)."""
    out = _run("""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")
        import numpy as np
        import pyarrow as pa
        from yarnflow.common.memory import defer_pandas_import
        defer_pandas_import()
        from yarnflow.worker.key_assignment import key_groups
        key_groups(pa.table({"s": ["a"] * 100}), ["s"], 128)
        print("pandas" in sys.modules)
        import pandas as pd
        print(pa.array(pd.Series([1.0, np.nan])).null_count)
    """)
    assert out[0] == "False" and out[-1] == "1"
    assert "process.memory.defer-pandas-import" in " ".join(out)  # the warning names the option


def test_without_deferral_pyarrow_loads_pandas_as_usual():
    out = _run("""
        import sys
        import pyarrow as pa
        from yarnflow.common.memory import configure_process_memory
        configure_process_memory("mimalloc", 0, False)
        pa.array([1, 2]).to_numpy(zero_copy_only=False)
        print("pandas" in sys.modules, pa.default_memory_pool().backend_name)
    """)
    assert out == ["True", "mimalloc"]


def test_a_taskexecutor_warms_pyarrows_pandas_support_on_a_thread_as_it_starts():
    """The ~0.3 s import is made on a thread of its own at start-up, not in a task's first batch;
    afterwards pyarrow recognises pandas objects (its C++ layer too: pd.NA is a null)."""
    out = _run("""
        import sys
        import pyarrow as pa
        from yarnflow.common.memory import warm_pandas_support
        thread = warm_pandas_support()
        print(thread.name)
        thread.join(30)
        print("pandas" in sys.modules)
        import pandas as pd
        print(pa.array([pd.NA, 1], from_pandas=True).null_count, warm_pandas_support())
    """)
    assert out == ["warm-pandas", "True", "1", "None"]


def test_with_deferral_a_taskexecutor_does_not_load_pandas():
    """``process.memory.defer-pandas-import`` still keeps pandas out of a TaskExecutor: the warm-up
    is skipped, so the idle TaskExecutor process has no pandas mapped."""
    out = _run("""
        import subprocess, sys, time
        code = ("import sys; from yarnflow.worker.__main__ import main; "
                "sys.argv[1:] = ['--resource-id', 'te', '--work-dir', sys.argv[1], '--rm-address', '127.0.0.1:9', "
                "'-D', 'process.memory.defer-pandas-import=' + sys.argv[2]]; main()")
        import tempfile
        for defer in ("true", "false"):
            with tempfile.TemporaryDirectory() as d:
                proc = subprocess.Popen([sys.executable, "-c", code, d, defer], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                try:
                    loaded = False
                    for _ in range(30):  # (the warm-up takes ~0.5 s)
                        time.sleep(0.1)
                        loaded = "pandas/_libs" in open(f"/proc/{proc.pid}/maps").read()
                        if loaded:
                            break
                    print(defer, loaded)
                finally:
                    proc.kill()
                    proc.wait()
    """)
    assert out == ["true", "False", "false", "True"]


def test_an_allocator_this_pyarrow_lacks_keeps_the_default_and_says_so():
    out = _run("""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")
        import pyarrow as pa
        from yarnflow.common.memory import _configure_arrow_pool
        before = pa.default_memory_pool().backend_name
        _configure_arrow_pool("tcmalloc")
        print(pa.default_memory_pool().backend_name == before)
    """)
    assert out[-1] == "True" and "'tcmalloc' is not available" in " ".join(out)


_GROUP_BY_IN_A_STARTED_PROCESS = """
    import argparse, logging, sys
    from yarnflow.common.process import add_common_arguments, start_process
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    start_process(parser.parse_args(sys.argv[1:]))
    logging.getLogger().handlers[0].setStream(sys.stdout)
    import numpy as np
    import pyarrow as pa
    table = pa.table({"k": np.arange(100_000) % 100, "v": np.arange(100_000)})
    result = table.group_by("k").aggregate([("v", "sum")])  # Acero: Arrow's C++ layer allocates
    print(pa.mimalloc_memory_pool().bytes_allocated() > 0, pa.system_memory_pool().bytes_allocated() > 0)
"""


@pytest.mark.parametrize("allocator, expected", [("system", ["False", "True"]), ("mimalloc", ["True", "False"])])
def test_the_configured_allocator_serves_arrows_cpp_layer_too(allocator, expected):
    """``pa.set_memory_pool`` reaches only pyarrow's Python layer: Acero, Flight and the Parquet
    reader allocated from mimalloc whatever the option said (~30 MB more a cluster on W1/W2)."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_GROUP_BY_IN_A_STARTED_PROCESS),
                           "-D", f"process.memory.arrow-allocator={allocator}"],
                          capture_output=True, text=True, timeout=50, stdin=subprocess.DEVNULL, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == expected
    assert "WARNING" not in proc.stdout + proc.stderr


def test_pyarrow_loaded_before_the_settings_is_reported():
    out = _run("""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")
        import pyarrow as pa
        from yarnflow.common.memory import configure_process_memory
        configure_process_memory("system", 0, False)
        print(pa.default_memory_pool().backend_name)
    """)
    assert out[-1] == "system"
    assert "keeps allocating from mimalloc" in " ".join(out)


def test_threads_importing_pandas_at_once_all_get_it():
    """Two subtasks of a TaskExecutor may import pandas at the same moment."""
    out = _run("""
        import threading
        import pyarrow as pa
        from yarnflow.common.memory import defer_pandas_import
        defer_pandas_import()
        pa.array([1])
        errors, done = [], []
        def work():
            try:
                import pandas as pd
                done.append(pa.array(pd.Series([1.0, float("nan")])).null_count)
            except Exception as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(errors == [], done == [1] * 8)
    """)
    assert out == ["True", "True"]


def test_processes_on_the_hashmap_backend_do_not_load_rocksdict():
    """rocksdict (RocksDB) costs each process ~8 MB: only jobs on the rocksdb backend load it."""
    out = _run("""
        import sys
        import yarnflow.am.appmaster, yarnflow.worker.taskexecutor.task_executor
        print("rocksdict" in sys.modules)
        from yarnflow.common.rocksdb_snapshot import db_options
        db_options()
        print("rocksdict" in sys.modules)
    """)
    assert out == ["False", "True"]
