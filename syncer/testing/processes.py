"""The processes of the local control planes: spawned so that they die with this process, tracked for leak
checks, stopped with SIGTERM then SIGKILL; and the directories of planes whose owner died, removed.

- they are spawned with ``PR_SET_PDEATHSIG`` (SIGKILL) by one daemon thread of this module that lives as long
  as the process. The kernel sends that signal when the *thread* that forked the child exits, so spawning
  from the caller's thread would kill the apiserver as soon as a short-lived thread (``threading.Thread``,
  ``asyncio.to_thread``) that called ``restart_apiserver()`` ends.
- a process killed before its ``atexit`` hook ran leaves its directory behind; each directory records its
  owner (PID, start time, PID namespace), and the next ``ControlPlane`` created by the same user removes the
  directories whose owner is gone.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, BinaryIO, Callable

_SPAWN_TIMEOUT = 30.0
_KILL_TIMEOUT = 10.0
OWNER_FILE = "owner.json"


_spawned_pids: list[int] = []


def leftover_pids() -> list[int]:
    """PIDs of etcd/apiserver processes started in this process that are still running (not zombies)."""
    alive = []
    for pid in _spawned_pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or to answer; the message carries the tail of the process logs."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when the thread that forked it exits."""

    def preexec() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # The parent may have died between fork and prctl, in which case the signal would never come.
        if os.getppid() != parent:
            os._exit(1)

    return preexec


_Proc = subprocess.Popen[bytes]


class _Spawner:
    """Runs every ``Popen`` of this module on one daemon thread that lives as long as the process.

    ``PR_SET_PDEATHSIG`` is tied to the thread that forks, not to the process: a child forked by a thread that
    then exits is SIGKILLed right away. A daemon thread is never joined, so it exits only with the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], _Proc], Future[_Proc]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def popen(self, argv: list[str], log: BinaryIO, cwd: Path) -> _Proc:
        """Start ``argv`` (output to the open file ``log``) from the helper thread; wait at most 30 s for it."""
        future: Future[_Proc] = Future()

        def call() -> _Proc:
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with(os.getpid()), process_group=0, cwd=cwd,
            )

        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kube-syncer-spawner", daemon=True)
                self._thread.start()
        self._jobs.put((call, future))
        try:
            return future.result(timeout=_SPAWN_TIMEOUT)
        except FutureTimeout:
            raise ControlPlaneError(f"starting {argv[0]} took more than {_SPAWN_TIMEOUT:.0f}s") from None

    def _run(self) -> None:
        while True:
            call, future = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as e:
                    future.set_exception(e)


_spawner = _Spawner()


def _new_spawner_after_fork() -> None:
    # A forked child has no helper thread (only the forking thread survives a fork) and must not share the queue.
    global _spawner
    _spawner = _Spawner()


os.register_at_fork(after_in_child=_new_spawner_after_fork)


def _identity(pid: int) -> dict[str, Any] | None:
    """What tells process ``pid`` apart from a later one that reuses its PID; None if it is gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    if fields[0] == "Z":
        return None
    # fields[19] is starttime (field 22 of proc_pid_stat(5)), in clock ticks since boot.
    return {"pid": pid, "start_time": fields[19], "pid_namespace": namespace}


def remove_orphaned_dirs() -> None:
    """Remove control-plane directories of this user whose owner process is gone.

    A directory without a readable owner record is left alone (another user, an older version, or an owner
    that has just created it); so is one owned from another PID namespace, where the PID cannot be checked.
    """
    me = _identity(os.getpid())
    if me is None:
        return
    for directory in Path(tempfile.gettempdir()).glob("*-cp-*"):
        try:
            info = directory.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            owner = json.loads((directory / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(owner, dict) or owner.get("pid_namespace") != me["pid_namespace"]:
            continue
        if not isinstance(owner.get("pid"), int) or _identity(owner["pid"]) != owner:
            shutil.rmtree(directory, ignore_errors=True)



def claim(directory: Path) -> None:
    """Record this process as the owner of a new control-plane ``directory``."""
    (directory / OWNER_FILE).write_text(json.dumps(_identity(os.getpid())))


def spawn(argv: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` with its output appended to ``log``, to die with this process (see the module's docstring)."""
    with open(log, "ab") as out:
        proc = _spawner.popen(argv, out, cwd)
    _spawned_pids.append(proc.pid)
    return proc


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> int | None:
    """Stop ``proc`` (SIGTERM, then SIGKILL after ``timeout``); its exit status, or None if there was none."""
    if proc is None:
        return None
    if proc.poll() is not None:
        return proc.returncode
    proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
    try:
        return proc.wait(_KILL_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ControlPlaneError(f"pid {proc.pid} survived SIGKILL for {_KILL_TIMEOUT:.0f}s") from None
