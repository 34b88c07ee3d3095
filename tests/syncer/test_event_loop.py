"""Which event loop `syncer run` runs on: uvloop when the `uvloop` setting is true (the default) and uvloop
imports, asyncio's own otherwise; everything else keeps the loop its caller chose."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from syncer.cli import event_loop
from syncer.settings import Settings
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 20


def test_uvloop_by_default() -> None:
    uvloop = pytest.importorskip("uvloop")
    factory, which = event_loop(Settings())
    assert factory is uvloop.new_event_loop and which.startswith("uvloop ")
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_asyncio_when_turned_off() -> None:
    assert event_loop(replace(Settings(), uvloop=False)) == (None, "asyncio (setting 'uvloop' is false)")


def test_asyncio_when_uvloop_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # makes `import uvloop` raise ImportError
    factory, which = event_loop(Settings())
    assert factory is None
    assert which.startswith("asyncio, not uvloop: it cannot be imported") and "set uvloop = false" in which


async def test_the_library_leaves_the_callers_loop_alone() -> None:
    """Importing the packages (and asking which loop the sidecar would use) installs no loop policy."""
    import controllers  # noqa: F401
    import informers  # noqa: F401
    import syncer.runtime  # noqa: F401

    event_loop(Settings())
    assert type(asyncio.get_event_loop_policy()).__module__.startswith("asyncio.")
    assert type(asyncio.get_running_loop()).__module__.startswith("asyncio.")


@pytest.mark.parametrize(("setting", "logged", "sig"), [
    ("", "event loop: uvloop ", signal.SIGTERM),
    ("", "event loop: uvloop ", signal.SIGINT),
    ("uvloop = false\n", "event loop: asyncio (setting 'uvloop' is false)", signal.SIGTERM),
])
def test_run_logs_its_loop_and_stops_on_signals(tmp_path: Path, setting: str, logged: str,
                                                sig: signal.Signals) -> None:
    """`syncer run` against an API server that is not there: it logs its loop, keeps retrying, and a signal
    stops it cleanly (exit 0) on either loop."""
    if not setting:
        pytest.importorskip("uvloop")
    kubeconfig = tmp_path / "closed.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "closed", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "closed", "user": "u"}}],
    }))
    (tmp_path / "s.toml").write_text(f'kubeconfig = "{kubeconfig}"\nhttp_bind = "127.0.0.1:{free_port()}"\n'
                                     f'{setting}')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCER_") and k != "KUBECONFIG"}
    proc = subprocess.Popen([sys.executable, "-m", "syncer", "run", "--settings", str(tmp_path / "s.toml")],
                            cwd=ROOT, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        # The first failed connection attempt shows the loop runs and the signal handlers are installed.
        while (line := proc.stderr.readline()) and "not reachable" not in line:
            seen.append(line)
            assert time.monotonic() < deadline, "".join(seen)
        assert line, f"syncer run exited ({proc.wait()}):\n{''.join(seen)}"
        proc.send_signal(sig)
        _, rest = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = "".join(seen) + rest
    assert [line for line in seen if "event loop: " in line and " INFO " in line and logged in line], log
    assert proc.returncode == 0, log
    assert "Traceback" not in log and "stopped" in log, log
