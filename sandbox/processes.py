"""Container processes of the YARN sandbox: starting, watching and killing them, and putting a
container's files in place (localization).

Every container runs under a small *runner* (this very file, run as a script by path, so it
imports nothing but the standard library and starts in a few milliseconds)::

    python processes.py SANDBOX_PID GRACE_S [--netns NETNS [--hide DIR]...] -- bash .skein.sh
    python processes.py --enter NETNS [--hide DIR]... -- COMMAND   (enter a host, exec COMMAND)

The runner leads the container's process group (the sandbox starts it with
``start_new_session``), is a child subreaper (``PR_SET_CHILD_SUBREAPER``: orphaned descendants,
even ones that left the group, are re-parented to it) and gets SIGTERM when the sandbox dies
(``PR_SET_PDEATHSIG``, so a SIGKILLed sandbox leaves nothing behind). It runs the command and,
as a NodeManager does for a container: when the command exits, or when the runner gets SIGTERM
(a kill, or its parent died), it sends SIGTERM to every descendant, waits ``GRACE_S`` and
SIGKILLs what is left. It then exits as the command did (the same exit code, or killed by the
same signal), so the sandbox sees the command's status as the container's.

On a sandbox whose hosts are apart (hosts.py), the runner first enters its container's host
(``enter_host``): the host's network namespace, and a mount namespace of its own in which the
other hosts' folders (``--hide``) are empty, read-only tmpfs mounts.

Threads (sandbox side): ``ProcessLauncher`` owns one thread, ``sandbox-launcher``, which forks
every runner, because Linux sends the parent-death signal when the *thread* that forked exits:
it must live as long as the containers. Each started container has a thread
``container-<name>`` that waits for its runner, SIGKILLs its process group if a kill takes
longer than the grace period plus a margin, and then reports the exit through a callback.
"""

from __future__ import annotations

import ctypes
import os
import queue
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 1, 2, 4, 0x4000, 0x40000
PR_SET_CHILD_SUBREAPER = 36
#: how long the sandbox waits, past the runner's own grace period, before SIGKILLing the group
KILL_MARGIN_S = 2.0
RUNNER = os.path.abspath(__file__)


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def enter_network(netns: str) -> None:
    """Move the calling thread into the network namespace ``netns`` (``ip netns``'s name): the
    sockets it makes from then on belong to that host. Raises OSError (root is needed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join("/run/netns", netns), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"cannot enter network namespace {netns}")
    finally:
        os.close(fd)


def enter_host(netns: str, hidden: Sequence[str]) -> None:
    """Move the calling (single-threaded) process onto a host: into the network namespace
    ``netns`` and into a mount namespace of its own in which every folder of ``hidden`` is an
    empty read-only tmpfs. Raises OSError when it cannot (root is needed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    enter_network(netns)
    if not hidden:
        return
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "cannot make a mount namespace")
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # (nothing leaks to the machine's)
        raise OSError(ctypes.get_errno(), "cannot make the mounts private")
    for folder in hidden:
        if os.path.isdir(folder) and libc.mount(b"yarn-sandbox-hidden", os.fsencode(folder), b"tmpfs",
                                                MS_RDONLY | MS_NOSUID | MS_NODEV, b"size=4k") != 0:
            raise OSError(ctypes.get_errno(), f"cannot hide {folder}")


def _host_options(args: list[str]) -> tuple[str | None, list[str], list[str]]:
    """``[--netns NETNS] [--hide DIR]... -- COMMAND...`` -> (netns, hidden, command)."""
    netns, hidden = None, []
    while args and args[0] != "--":
        option, value, args = args[0], args[1], args[2:]
        if option in ("--netns", "--enter"):
            netns = value
        elif option == "--hide":
            hidden.append(value)
        else:
            raise ValueError(f"unknown option {option}")
    return netns, hidden, args[1:]


def describe_exit(returncode: int) -> str:
    """``exit code 3`` or ``signal 9 (SIGKILL)`` for a ``Popen.returncode``."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown signal"
    return f"signal {-returncode} ({name})"


def yarn_exit_status(returncode: int) -> int:
    """The exit status YARN reports for a container: a signal ``s`` shows as ``128 + s``."""
    return returncode if returncode >= 0 else 128 - returncode


# --------------------------------------------------------------------------- the runner


def _descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def _signal_all(pids: Sequence[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass


def _exec_child(command: Sequence[str]) -> None:
    """In the forked child: die with the runner, default signal dispositions, exec ``command``."""
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(signum, signal.SIG_DFL)
        os.execvp(command[0], list(command))
    except BaseException as exc:  # noqa: B036 - nothing may escape a forked child
        try:
            os.write(2, f"container runner: cannot run {command[0]!r}: {exc}\n".encode())
        finally:
            os._exit(127)


def run_container(sandbox_pid: int, grace_s: float, command: Sequence[str]) -> int:
    """The runner's main loop (see the module docstring); returns the exit code to exit with
    when the command was not killed by a signal (then the runner kills itself the same way)."""
    requested: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        requested.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != sandbox_pid:  # the sandbox died before prctl took effect
        return 128 + signal.SIGTERM
    child = os.fork()
    if child == 0:
        _exec_child(command)
    status: int | None = None
    kill_at: float | None = None
    while True:
        now = time.monotonic()
        if requested and kill_at is None:
            _signal_all([child, *_descendants(os.getpid())], signal.SIGTERM)
            kill_at = now + grace_s
        while True:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:
                status = wstatus
        if status is not None:
            rest = _descendants(os.getpid())
            if not rest:
                break
            if kill_at is None:
                _signal_all(rest, signal.SIGTERM)
                kill_at = now + grace_s
            elif now >= kill_at:
                _signal_all(rest, signal.SIGKILL)
        elif kill_at is not None and now >= kill_at:
            _signal_all([child, *_descendants(os.getpid())], signal.SIGKILL)
        time.sleep(0.02 if kill_at is not None else 0.05)
    assert status is not None
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # die of the same signal, so the sandbox sees what killed the container
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # these two cannot be handled anyway
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


# --------------------------------------------------------------------------- the sandbox side


@dataclass(frozen=True)
class LaunchRequest:
    """What a container runs: ``command`` in ``cwd`` with exactly ``env``, its stdout and stderr
    appended to the two files; on host ``netns`` (None: this machine) with ``hidden`` hidden."""

    name: str
    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    stdout_path: str
    stderr_path: str
    netns: str | None = None
    hidden: tuple[str, ...] = ()


class ContainerProcess:
    """One started container (its runner). ``pid`` is also its process group id; ``returncode``
    is None while it runs. ``terminate()`` asks for a stop and returns at once; ``wait()``
    blocks until the exit was reported."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str, grace_s: float,
                 on_exit: Callable[[ContainerProcess], None]) -> None:
        self._popen = popen
        self.name = name
        self.pid = popen.pid
        self._grace_s = grace_s
        self._on_exit = on_exit
        self._kill_at: float | None = None
        self.returncode: int | None = None
        self._done = threading.Event()
        threading.Thread(target=self._monitor, name=f"container-{name}", daemon=True).start()

    def terminate(self) -> None:
        """SIGTERM to the runner, which stops the container's processes (SIGKILL after the grace
        period); the whole process group is SIGKILLed if that takes longer still."""
        if self._done.is_set() or self._kill_at is not None:
            return
        self._kill_at = time.monotonic() + self._grace_s + KILL_MARGIN_S
        try:
            os.kill(self.pid, signal.SIGTERM)
        except OSError:
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """True once the container has exited and its exit was reported."""
        return self._done.wait(timeout)

    def _monitor(self) -> None:
        # Wait without reaping (WNOWAIT): while the runner is a zombie its pid, the group's id,
        # cannot be reused, so the final sweep of the group cannot hit a stranger.
        while True:
            try:
                if os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    break
            except ChildProcessError:
                break
            if self._kill_at is not None and time.monotonic() >= self._kill_at:
                self._kill_group()
            time.sleep(0.05)
        self._kill_group()  # whatever is left in the group
        returncode = self._popen.wait()
        self.returncode = returncode
        try:
            self._on_exit(self)
        finally:
            self._done.set()

    def _kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass


class ProcessLauncher:
    """Forks container runners from its one long-lived thread (see the module docstring) and
    keeps every container it started until it exits."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._requests: queue.Queue[tuple[LaunchRequest, Callable[[ContainerProcess], None],
                                          Future[ContainerProcess]] | None] = queue.Queue()
        self._live: dict[int, ContainerProcess] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="sandbox-launcher", daemon=True)
        self._thread.start()

    def launch(self, request: LaunchRequest, on_exit: Callable[[ContainerProcess], None]) -> ContainerProcess:
        """Start ``request``'s container; ``on_exit`` is called (on the container's thread) when it
        has exited. Raises OSError when it cannot be started, RuntimeError after ``close()``."""
        future: Future[ContainerProcess] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the sandbox is stopping: no more containers are started")
            self._requests.put((request, on_exit, future))
        return future.result()

    def live(self) -> list[ContainerProcess]:
        with self._lock:
            return list(self._live.values())

    def close(self, timeout: float = 10.0) -> None:
        """Stop every live container (SIGTERM, SIGKILL after the grace period) and the thread."""
        with self._lock:
            self._closed = True
            self._requests.put(None)
        self._thread.join(timeout)
        procs = self.live()
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(max(0.0, deadline - time.monotonic()))

    def _loop(self) -> None:
        while True:
            item = self._requests.get()
            if item is None:
                return
            request, on_exit, future = item
            try:
                future.set_result(self._spawn(request, on_exit))
            except BaseException as exc:  # noqa: B036 - handed to the caller
                future.set_exception(exc)

    def _spawn(self, request: LaunchRequest, on_exit: Callable[[ContainerProcess], None]) -> ContainerProcess:
        def exited(proc: ContainerProcess) -> None:
            with self._lock:
                self._live.pop(proc.pid, None)
            on_exit(proc)

        host = [] if request.netns is None else ["--netns", request.netns, *(a for d in request.hidden for a in ("--hide", d))]
        command = [sys.executable, RUNNER, str(os.getpid()), repr(self.grace_s), *host, "--", *request.command]
        with open(request.stdout_path, "ab") as out, open(request.stderr_path, "ab") as err:
            popen = subprocess.Popen(command, cwd=request.cwd, env=dict(request.env), stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=err, start_new_session=True, close_fds=True)
        with self._lock:
            proc = ContainerProcess(popen, request.name, self.grace_s, exited)
            self._live[proc.pid] = proc
        return proc


# --------------------------------------------------------------------------- localization


@dataclass(frozen=True)
class LocalFile:
    """A file to put in a container: ``url`` (``file:///path`` or anything fsspec opens)
    copied to ``target``; an archive (zip, jar, tar, tar.gz, tgz, ...) is extracted into a
    directory named ``target``."""

    target: str
    url: str
    archive: bool


def local_path(url: str) -> str | None:
    """The path of a ``file://`` URL (None for other schemes)."""
    if url.startswith("file://"):
        return url[len("file://"):]
    return None if "://" in url else url


def localize(files: Sequence[LocalFile], directory: str) -> None:
    """Put ``files`` into ``directory``. Raises OSError (or ValueError for an archive that is
    not one) naming the file."""
    for item in files:
        target = os.path.join(directory, item.target)
        os.makedirs(os.path.dirname(target) or directory, exist_ok=True)
        path = local_path(item.url)
        if path is None:
            path = _download(item.url, os.path.join(directory, ".skein.download", os.path.basename(item.url)))
        elif not os.path.exists(path):
            raise FileNotFoundError(f"File {item.url} does not exist")
        if item.archive:
            _extract(path, target)
        elif os.path.isdir(path):
            shutil.copytree(path, target, symlinks=True)
        else:
            shutil.copy2(path, target)


def _download(url: str, path: str) -> str:
    import fsspec  # only for files that are not local

    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with fsspec.open(url, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except Exception as exc:
        raise OSError(f"cannot download {url}: {exc}") from exc
    return path


def _extract(path: str, target: str) -> None:
    os.makedirs(target, exist_ok=True)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            zf.extractall(target)
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as tf:
            if hasattr(tarfile, "tar_filter"):
                # as YARN's localizer (GNU tar) does: members stay inside the folder, but a symlink
                # may point to an absolute path (venv-pack's bin/python points to the node's Python)
                tf.extractall(target, filter="tar")
            else:  # pragma: no cover - Python < 3.11.4
                tf.extractall(target)
    else:
        raise ValueError(f"{path} is neither a zip nor a tar archive")


def _main(argv: list[str]) -> int:
    usage = ("usage: processes.py SANDBOX_PID GRACE_S [--netns NETNS] [--hide DIR]... -- COMMAND [ARG...]\n"
             "       processes.py --enter NETNS [--hide DIR]... -- COMMAND [ARG...]")
    try:
        if argv[:1] == ["--enter"]:
            netns, hidden, command = _host_options(argv)
            if netns is None or not command:
                sys.exit(usage)
            enter_host(netns, hidden)
            os.execvp(command[0], command)
        sandbox_pid, grace_s = int(argv[0]), float(argv[1])
        netns, hidden, command = _host_options(argv[2:])
    except (IndexError, ValueError):
        sys.exit(usage)
    if not command:
        sys.exit(usage)
    if netns is not None:
        enter_host(netns, hidden)
    return run_container(sandbox_pid, grace_s, command)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
