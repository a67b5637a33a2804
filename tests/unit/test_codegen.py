"""The committed generated code matches the IDL, drift is detected, and the repo's thrift/
folder never shadows the thrift library."""

from __future__ import annotations

import shutil
import tempfile
import subprocess
import sys
from pathlib import Path

import pytest

import yarnflow.common
from yarnflow.common.rpc import codegen

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

REPO = Path(yarnflow.common.__file__).resolve().parent.parent
needs_compiler = pytest.mark.skipif(shutil.which("thrift") is None,
                                    reason="the Apache Thrift compiler is not on PATH")


def _copy_repo_parts(dest: Path) -> Path:
    """The parts of the repository that codegen reads: thrift/, common/rpc/gen/ and
    common/rpc/services/."""
    shutil.copytree(REPO / "thrift", dest / "thrift")
    shutil.copytree(REPO / "common" / "rpc" / "gen", dest / "common" / "rpc" / "gen",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "common" / "rpc" / "services", dest / "common" / "rpc" / "services",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _edit_idl(root: Path, old: str, new: str) -> None:
    idl = root / "thrift" / "yarnflow.thrift"
    text = idl.read_text()
    assert text.count(old) == 1, old
    idl.write_text(text.replace(old, new))


def test_the_repository_layout_is_what_the_test_expects() -> None:
    assert (REPO / "thrift" / "yarnflow.thrift").is_file()
    assert (REPO / "common" / "rpc" / "gen" / "yarnflow_rpc" / "ttypes.py").is_file()


@needs_compiler
def test_committed_generated_code_matches_the_idl() -> None:
    assert codegen.drifted(REPO) == []


@needs_compiler
def test_an_unmodified_copy_has_no_drift(tmp_path: Path) -> None:
    assert codegen.drifted(_copy_repo_parts(tmp_path)) == []


@needs_compiler
def test_a_changed_struct_is_detected(tmp_path: Path) -> None:
    root = _copy_repo_parts(tmp_path)
    _edit_idl(root, "  4: optional string job_id,\n}", "  4: optional string job_id,\n  5: i32 extra,\n}")
    assert "yarnflow_rpc/ttypes.py" in codegen.drifted(root)


@needs_compiler
def test_a_changed_method_is_detected(tmp_path: Path) -> None:
    root = _copy_repo_parts(tmp_path)
    _edit_idl(root, "  string ping(),", "  string ping(1: string payload),")
    # only the changed service's module of the services package
    assert codegen.drifted(root) == ["../services/task_executor.py", "yarnflow_rpc/TaskExecutorService.py"]


@needs_compiler
def test_a_new_rpc_is_an_idl_change_the_gateway_and_handler_follow(tmp_path: Path) -> None:
    """Adding an RPC: the generated gateway gets a typed method for it and the handler hands it,
    fenced when its first parameter is a fencing token, to the endpoint's method of that name."""
    root = _copy_repo_parts(tmp_path)
    _edit_idl(root, "  string ping(),", "  string ping(),\n  i64 countTasks(1: string jobmaster_fencing_token, "
                                        "2: string job_id, 3: list<SlotOffer> offers)")
    with tempfile.TemporaryDirectory() as out:
        codegen.generate(root, Path(out))
        text = codegen.services(Path(out))["task_executor.py"]
    assert ("    def count_tasks(self, jobmaster_fencing_token: str, job_id: str, offers: list[SlotOffer], *, "
            "rpc_timeout_ms: int | None = None) -> int:") in text
    # the wire values converted by read_args: a frame short of an argument is the caller's error
    assert ('self._e.rpc_invoke("count_tasks", jobmaster_fencing_token, read_args("countTasks", lambda: '
            '(JobID(job_id), [SlotOffer.from_thrift(v) for v in offers or ()], )))') in text
    assert '    "count_tasks": True,' in text


@needs_compiler
def test_a_new_service_is_detected_as_missing(tmp_path: Path) -> None:
    root = _copy_repo_parts(tmp_path)
    idl = root / "thrift" / "yarnflow.thrift"
    idl.write_text(idl.read_text() + "\nservice ProbeService {\n  string probe(),\n}\n")
    bad = codegen.drifted(root)
    assert "yarnflow_rpc/ProbeService.py" in bad
    assert "yarnflow_rpc/__init__.py" in bad  # lists the services
    assert "../services/probe.py" in bad and "../services/__init__.py" in bad


@needs_compiler
def test_a_deleted_or_hand_edited_generated_file_is_detected(tmp_path: Path) -> None:
    root = _copy_repo_parts(tmp_path)
    gen = root / "common" / "rpc" / "gen" / "yarnflow_rpc"
    (gen / "constants.py").unlink()
    ttypes = gen / "ttypes.py"
    ttypes.write_text(ttypes.read_text().replace("class SlotReport(object):", "class SlotReport(dict):"))
    assert sorted(codegen.drifted(root)) == ["yarnflow_rpc/constants.py", "yarnflow_rpc/ttypes.py"]


@needs_compiler
def test_a_stale_file_left_from_a_removed_service_is_detected(tmp_path: Path) -> None:
    root = _copy_repo_parts(tmp_path)
    (root / "common" / "rpc" / "gen" / "yarnflow_rpc" / "OldService.py").write_text("# gone from the IDL\n")
    assert codegen.drifted(root) == ["yarnflow_rpc/OldService.py"]


@needs_compiler
def test_a_stale_services_module_or_a_hand_edited_one_is_detected(tmp_path: Path) -> None:
    root = _copy_repo_parts(tmp_path)
    services = root / "common" / "rpc" / "services"
    (services / "old.py").write_text("# a service gone from the IDL\n")
    dispatcher = services / "dispatcher.py"
    dispatcher.write_text(dispatcher.read_text().replace('"submit_job": True', '"submit_job": False'))
    assert codegen.drifted(root) == ["../services/dispatcher.py", "../services/old.py"]


@needs_compiler
def test_comment_only_differences_are_not_drift(tmp_path: Path) -> None:
    root = _copy_repo_parts(tmp_path)
    ttypes = root / "common" / "rpc" / "gen" / "yarnflow_rpc" / "ttypes.py"
    ttypes.write_text("# Generated by another compiler build\n" + ttypes.read_text())
    assert codegen.drifted(root) == []


@needs_compiler
def test_check_and_regenerate_from_the_command_line(tmp_path: Path) -> None:
    root = _copy_repo_parts(tmp_path)
    _edit_idl(root, "  string ping(),", "  string ping(1: string payload),")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "yarnflow.common.rpc.codegen", *args], cwd=root,
                              capture_output=True, text=True, timeout=60)

    check = run("--check")
    assert check.returncode == 1
    assert "common/rpc/gen/yarnflow_rpc/TaskExecutorService.py" in check.stdout
    regen = run()
    assert regen.returncode == 0, regen.stderr
    assert run("--check").returncode == 0
    service = (root / "common" / "rpc" / "gen" / "yarnflow_rpc" / "TaskExecutorService.py").read_text()
    assert service.startswith("# Generated from thrift/yarnflow.thrift")
    assert "def ping(self, payload):" in service


def test_generated_files_say_so_in_their_first_line() -> None:
    gen = REPO / "common" / "rpc" / "gen"
    files = sorted(gen.rglob("*.py"))
    assert files
    for path in files:
        assert path.read_text().startswith("# Generated from thrift/yarnflow.thrift"), path


def test_the_thrift_folder_does_not_shadow_the_library() -> None:
    assert not (REPO / "thrift" / "__init__.py").exists()
    import thrift

    assert thrift.__file__ is not None
    library = Path(thrift.__file__).resolve().parent
    assert library != (REPO / "thrift").resolve()
    assert (library / "protocol" / "TBinaryProtocol.py").is_file()


def test_the_library_wins_even_from_the_repository_root() -> None:
    """``python`` run in the repo root puts the root first on sys.path; still the library."""
    out = subprocess.run([sys.executable, "-c", "import thrift, thrift.Thrift; print(thrift.__file__)"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    assert path.name == "__init__.py"
    assert path.resolve().parent != (REPO / "thrift").resolve()
