"""The public API of ``import yarnflow``: ``__all__`` names exactly what users may rely on."""

from __future__ import annotations

import re
import types

import pytest

import yarnflow

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

# What the README and the docstrings tell users to use; each must stay exported.
DOCUMENTED = {
    "__version__",
    "StreamExecutionEnvironment",
    "DataStream",
    "KeyedStream",
    "JobExecutionResult",
    "YarnflowError",
    "ConfigurationError",
    "JobDefinitionError",
    "JobFailedError",
}


def test_every_name_in_all_exists() -> None:
    assert len(yarnflow.__all__) == len(set(yarnflow.__all__)), "duplicates in __all__"
    for name in yarnflow.__all__:
        assert hasattr(yarnflow, name), f"yarnflow.__all__ names {name!r}, which does not exist"


def test_all_holds_the_documented_names() -> None:
    missing = DOCUMENTED - set(yarnflow.__all__)
    assert not missing, f"documented names missing from yarnflow.__all__: {sorted(missing)}"


def test_all_lists_every_public_name() -> None:
    for name in yarnflow.__all__:
        getattr(yarnflow, name)  # resolve lazily imported names into the namespace
    public = {
        name for name, value in vars(yarnflow).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)  # submodules (yarnflow.datastream, ...) are not names
        and (getattr(value, "__module__", None) or "").startswith("yarnflow")  # defined by yarnflow
    }
    assert public, "found no public names: the check is broken"
    unlisted = public - set(yarnflow.__all__)
    assert not unlisted, f"public names missing from yarnflow.__all__: {sorted(unlisted)}"


def test_exported_names_are_yarnflow_objects() -> None:
    for name in yarnflow.__all__:
        if name == "__version__":
            continue
        value = getattr(yarnflow, name)
        assert isinstance(value, type), f"{name} is not a class"
        assert value.__module__.startswith("yarnflow."), f"{name} comes from {value.__module__}"
        assert value.__name__ == name


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from yarnflow import *", namespace)  # noqa: S102
    assert set(namespace) - {"__builtins__"} == set(yarnflow.__all__)


def test_errors_share_one_root() -> None:
    for name in ("ConfigurationError", "JobDefinitionError", "JobFailedError"):
        assert issubclass(getattr(yarnflow, name), yarnflow.YarnflowError)
    assert issubclass(yarnflow.JobDefinitionError, ValueError)  # catchable as the matching builtin


def test_unknown_names_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        yarnflow.no_such_name  # noqa: B018


def test_version_is_a_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", yarnflow.__version__)
