"""Regenerate (or check) the Python generated from thrift/*.thrift: the Thrift compiler's
output in common/rpc/gen/, and the gateways and handlers built on it in the package
common/rpc/services/ (``servicegen``, one module per service).

    python -m yarnflow.common.rpc.codegen            # regenerate, run from the repo root
    python -m yarnflow.common.rpc.codegen --check    # exit 1 when gen/ drifted from the IDL

Needs the Apache Thrift compiler (Debian: thrift-compiler) on PATH.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HEADER = "# Generated from {idl} by `python -m yarnflow.common.rpc.codegen`: do not edit by hand.\n"


def repo_root() -> Path:
    here = Path.cwd()
    for candidate in (here, *here.parents):
        if (candidate / "thrift").is_dir() and (candidate / "common" / "rpc").is_dir():
            return candidate
    raise SystemExit("run from inside the yarnflow repository (no thrift/ and common/rpc/ found)")


def generate(root: Path, out: Path) -> dict[str, str]:
    """Run the compiler on every IDL file into ``out``; returns {relative path: text}."""
    compiler = shutil.which("thrift")
    if compiler is None:
        raise FileNotFoundError("the thrift compiler is not on PATH (apt-get install thrift-compiler)")
    files: dict[str, str] = {}
    for idl in sorted((root / "thrift").glob("*.thrift")):
        subprocess.run([compiler, "-r", "--gen", "py", "-out", str(out), str(idl)], check=True)
        for path in out.rglob("*.py"):
            rel = path.relative_to(out).as_posix()
            files[rel] = HEADER.format(idl=f"thrift/{idl.name}") + path.read_text()
    return files


def services(out: Path) -> dict[str, str]:
    """The files of common/rpc/services/ for the compiler's output in ``out``: {name: text}."""
    return {name: HEADER.format(idl="thrift/*.thrift") + text for name, text in _services(out).items()}


def _services(out: Path) -> dict[str, str]:
    """The services package (``servicegen``), rendered from the service modules just generated in
    ``out``."""
    from yarnflow.common.rpc.servicegen import render

    packages = sorted(p.parent for p in out.glob("*/ttypes.py"))
    if len(packages) != 1:
        raise SystemExit(f"expected one generated Thrift package under {out}, found {len(packages)}")
    package = packages[0].name

    def forget() -> None:
        for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
            del sys.modules[name]

    forget()
    sys.path.insert(0, str(out))
    try:
        modules = {p.stem: importlib.import_module(f"{package}.{p.stem}") for p in packages[0].glob("*Service.py")}
        return render(f"yarnflow.common.rpc.gen.{package}", modules)
    finally:
        sys.path.remove(str(out))
        forget()


def _strip_comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def drifted(root: Path) -> list[str]:
    """Paths under gen/ that differ from, are missing against, or are stale leftovers of (no
    longer generated from) what the IDL generates."""
    gen = root / "common" / "rpc" / "gen"
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(root, Path(tmp))
        gateways = services(Path(tmp))
    bad = []
    folder = gen.parent / "services"
    for name, text in gateways.items():
        current = folder / name
        if not current.exists() or _strip_comments(current.read_text()) != _strip_comments(text):
            bad.append(f"../services/{name}")
    if folder.is_dir():
        bad.extend(f"../services/{p.name}" for p in sorted(folder.glob("*.py")) if p.name not in gateways)
    for rel, text in fresh.items():
        current = gen / rel
        if not current.exists() or _strip_comments(current.read_text()) != _strip_comments(text):
            bad.append(rel)
    bad.extend(rel for rel in sorted(p.relative_to(gen).as_posix() for p in gen.rglob("*.py"))
               if rel not in fresh)
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report drift, exit 1 if any")
    args = parser.parse_args(argv)
    root = repo_root()
    if args.check:
        bad = drifted(root)
        for rel in bad:
            print(f"common/rpc/gen/{rel} differs from what thrift/ generates".replace("gen/../", ""))
        return 1 if bad else 0
    gen = root / "common" / "rpc" / "gen"
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(root, Path(tmp))
        gateways = services(Path(tmp))
    folder = gen.parent / "services"
    if folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir()
    for name, text in gateways.items():
        (folder / name).write_text(text)
    for child in gen.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
    for rel, text in files.items():
        target = gen / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    print(f"regenerated {len(files)} files under {gen} and {len(gateways)} under {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
