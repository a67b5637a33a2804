"""Regenerate (or check) the Python generated from thrift/*.thrift into common/rpc/gen/.

    python -m yarnflow.common.rpc.codegen            # regenerate, run from the repo root
    python -m yarnflow.common.rpc.codegen --check    # exit 1 when gen/ drifted from the IDL

Needs the Apache Thrift compiler (Debian: thrift-compiler) on PATH.
"""

from __future__ import annotations

import argparse
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


def _strip_comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


def drifted(root: Path) -> list[str]:
    """Paths under gen/ that differ from, are missing against, or are stale leftovers of (no
    longer generated from) what the IDL generates."""
    gen = root / "common" / "rpc" / "gen"
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(root, Path(tmp))
    bad = []
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
            print(f"common/rpc/gen/{rel} differs from what thrift/ generates")
        return 1 if bad else 0
    gen = root / "common" / "rpc" / "gen"
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(root, Path(tmp))
    for child in gen.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
    for rel, text in files.items():
        target = gen / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    print(f"regenerated {len(files)} files under {gen}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
