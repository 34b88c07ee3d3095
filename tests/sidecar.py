"""The sidecar as users run it, ``python -m syncer run`` in a subprocess: a harness with its own HTTP port and log
(``Sidecar``), a bare process for given settings (``sidecar``), and waits on such a process that fail with its log."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[1]


class Sidecar:
    """One `syncer run` process with its own HTTP port and log file."""

    def __init__(self, tmp_path: Path, kubeconfig: str, name: str = "a", extra: str = "",
                 plugins: tuple[str, ...] = ("examples.plugins.widget_status",),
                 settings: Callable[[int], str] | None = None) -> None:
        """``settings``, if given, makes the whole settings file from the HTTP port instead (``kubeconfig``,
        ``extra`` and ``plugins`` unused)."""
        self.port = free_port()
        self.log_path = tmp_path / f"{name}.log"
        self.settings = tmp_path / f"{name}.toml"
        self.settings.write_text(settings(self.port) if settings is not None else
            f'kubeconfig = "{kubeconfig}"\nplugins = {json.dumps(list(plugins))}\n'
            f'include = ["core/configmaps", "core/namespaces", "examples.kube-syncer.io/*"]\n'
            f'http_bind = "127.0.0.1:{self.port}"\nshutdown_timeout = "10s"\n{extra}')
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "syncer", "run", "--settings", str(self.settings), "--identity", name],
            cwd=ROOT, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return 0, ""

    def status(self) -> dict:
        code, body = self.get("/status")
        return json.loads(body) if code == 200 else {}

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait(self, check, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                raise AssertionError(f"sidecar exited ({self.proc.returncode}) waiting for {what}:\n{self.log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.log[-3000:]}")
            time.sleep(0.1)

    def controller_state(self, name: str) -> str:
        for c in self.status().get("controllers", []):
            if c["name"] == name:
                return c["state"]
        return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def sidecar(settings: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``syncer run`` with these settings, its output in ``log``; killed at the end of the block if still running."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "syncer", "run", "--settings", str(settings)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def readyz(port: int) -> int:
    """The status code of the sidecar's ``/readyz`` on ``port`` (0 while nothing answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def status_of(port: int) -> dict[str, Any]:
    """The sidecar's ``/status`` document on ``port``."""
    doc: dict[str, Any] = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5).read())
    return doc


def wait_until(check: Callable[[], Any], what: str, proc: subprocess.Popen[Any], log: Path,
               timeout: float = 30) -> None:
    """Return once ``check()`` is true; fail with ``log`` if ``proc`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"syncer exited ({proc.returncode}) waiting for {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
