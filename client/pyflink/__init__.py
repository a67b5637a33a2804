"""PyFlink programs on yarnflow, unchanged: ``yarnflow run JOB.py`` maps every ``import
pyflink...`` to this package (``install``), which implements PyFlink's DataStream API over
yarnflow's own (``datastream/``: environment, streams, functions, the file connectors;
``common/``: Types, Row, Configuration, ...). Elements are stored as Arrow columns when their
type is given (``output_type=Types.TUPLE([...])``), else pickled (``datastream/records.py``).

What PyFlink has and this does not is an ImportError or a JobDefinitionError naming the
feature (the Table API, Java UDFs and jars; custom triggers and evictors in
the PyFlink layer so far)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Sequence

__all__ = ["install", "uninstall"]

#: modules of PyFlink that are features yarnflow does not have: what to say instead
UNSUPPORTED = {
    "pyflink.table": "PyFlink's Table API and SQL (pyflink.table) are not supported by yarnflow: use its DataStream "
                     "API, or yarnflow's env.spark_sql for SQL",
    "pyflink.java_gateway": "yarnflow runs no JVM: there is no Java gateway",
}


class _PyFlinkAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``pyflink.X`` as the module ``yarnflow.pyflink.X`` itself."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "pyflink" and not fullname.startswith("pyflink."):
            return None
        for prefix, why in UNSUPPORTED.items():
            if fullname == prefix or fullname.startswith(prefix + "."):
                raise ModuleNotFoundError(f"No module named {fullname!r}: {why}", name=fullname)
        try:
            real = importlib.util.find_spec("yarnflow." + fullname)
        except ModuleNotFoundError:
            real = None
        if real is None:
            raise ModuleNotFoundError(f"No module named {fullname!r}: yarnflow implements PyFlink's DataStream API "
                                      "(pyflink.datastream, pyflink.common) and not this module", name=fullname)
        return importlib.util.spec_from_loader(fullname, self, is_package=real.submodule_search_locations is not None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module("yarnflow." + spec.name)

    def exec_module(self, module: ModuleType) -> None:
        pass  # (yarnflow's module ran when it was imported)


_FINDER = _PyFlinkAliases()


def install() -> None:
    """``import pyflink...`` finds this package's modules from now on (first on the path: a
    job run by ``yarnflow run`` gets yarnflow's PyFlink, even beside apache-flink)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == "pyflink" or n.startswith("pyflink.")]:
        del sys.modules[name]

