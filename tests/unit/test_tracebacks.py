"""What a user is shown of a task's failure (common/tracebacks.py): their frames, never
yarnflow's, from the chained traceback a TaskExecutor sends."""

from __future__ import annotations

import os

import pytest

import yarnflow.common
from yarnflow.common.tracebacks import is_internal, user_traceback

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

OWN = os.path.dirname(os.path.dirname(os.path.realpath(yarnflow.common.__file__)))
WORKER = f"{OWN}/worker"  # (a source checkout or an installed yarnflow/: its worker package)

TASK_FAILURE = f'''Traceback (most recent call last):
  File "{WORKER}/operators/transforms.py", line 98, in apply_rows
    results.extend(map(fn, rows[start:stop]))
  File "job.py", line 3, in parse
    return {{"x": helper(row)}}
           ^^^^^^^^^^^
  File "/home/me/helpers.py", line 9, in helper
    return int(row["s"])
           ^^^^^^^^^^^^^
ValueError: invalid literal for int() with base 10: 'oops'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "{WORKER}/task.py", line 186, in _run
    self._stream_task.invoke()
  File "/opt/env/lib/python3.11/site-packages/yarnflow/worker/operators/transforms.py", line 102, in apply_rows
    raise op.user_error(fn, exc) from exc
yarnflow.worker.operators.base.UserFunctionError: user function parse in operator 'map' raised ValueError: invalid
'''


def test_a_task_failure_keeps_the_users_frames_and_error_only() -> None:
    assert user_traceback(TASK_FAILURE).splitlines() == [
        "Traceback (most recent call last):",
        '  File "job.py", line 3, in parse',
        '    return {"x": helper(row)}',
        "           ^^^^^^^^^^^",
        '  File "/home/me/helpers.py", line 9, in helper',
        '    return int(row["s"])',
        "           ^^^^^^^^^^^^^",
        "ValueError: invalid literal for int() with base 10: 'oops'",
    ]


def test_a_failure_inside_yarnflow_alone_shows_no_traceback() -> None:
    text = (f'Traceback (most recent call last):\n  File "{WORKER}/task.py", line 1, in _run\n    x()\n'
            'yarnflow.common.errors.SourceReadError: input path /x does not exist\n')
    assert user_traceback(text) == ""
    assert user_traceback("") == ""


def test_two_user_tracebacks_of_a_chain_keep_their_separator() -> None:
    text = ('Traceback (most recent call last):\n  File "job.py", line 1, in f\n    a()\nKeyError: 1\n\n'
            'During handling of the above exception, another exception occurred:\n\n'
            'Traceback (most recent call last):\n  File "job.py", line 2, in f\n    b()\nValueError: 2\n')
    assert user_traceback(text) == text.rstrip("\n")


def test_what_counts_as_yarnflow() -> None:
    assert is_internal(f"{WORKER}/task.py") and is_internal("<frozen runpy>")
    assert is_internal("/srv/container_1/environment/lib/python3.11/site-packages/yarnflow/worker/task.py")
    assert not is_internal("job.py") and not is_internal("/home/me/jobs/wordcount.py")
    assert not is_internal("/usr/lib/python3.11/json/decoder.py")  # a library the user's code called
