"""Fixtures for tests that go through YARN: the sandbox (yarnflow.sandbox) that the unmodified
skein client talks to as to a Hadoop cluster's skein driver. Registered in conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import skein
import skein.core

from tests.conftest import TAG_VAR
from yarnflow.sandbox import Sandbox

#: the sandbox's largest container (YARN's maximum allocation)
MAX_MEMORY_MB, MAX_VCORES = 2048, 2


@pytest.fixture
def skein_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process_tag: str) -> str:
    """A SKEIN_CONFIG of this test's own, seen by skein in this process (its ``properties`` are
    read at import, so they are made again) and by every process the test starts (which also
    carry the test's tag)."""
    config = str(tmp_path / "skein")
    monkeypatch.setenv("SKEIN_CONFIG", config)
    monkeypatch.setenv(TAG_VAR, process_tag)
    props = skein.core.Properties()
    monkeypatch.setattr(skein.core, "properties", props)
    monkeypatch.setattr(skein, "properties", props)
    return config


@pytest.fixture
def sandbox(skein_config: str, tmp_path: Path) -> Iterator[Sandbox]:
    """A running sandbox (skein's global driver for this test); stopped, with every process of
    its applications, at teardown."""
    with Sandbox(skein_config, work_dir=str(tmp_path / "work"), max_memory_mb=MAX_MEMORY_MB, max_vcores=MAX_VCORES,
                 kill_grace_s=0.5) as sb:
        yield sb
