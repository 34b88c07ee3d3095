"""``./dev``'s setup as a new user meets it: the first install shows pip's progress (not a block of setuptools
warnings from the editable build), later runs print nothing. The Python it runs is a stub that records the pip
commands, so the test needs no network and takes a second."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A python3 stand-in: `-c` checks pass, `-m venv DIR` makes DIR/bin/python (this script), `-m pip` records its
# arguments with the PYTHONWARNINGS it got, `-m syncer.testing` finds the control plane.
STUB = """#!/bin/sh
case "$1 $2" in
  "-m venv") mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
  "-m pip") echo "PYTHONWARNINGS=${PYTHONWARNINGS:-} $*" >> "$PIP_LOG" ;;
esac
exit 0
"""


def _setup(tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    log = tmp_path / "pip.log"
    log.write_text("")
    env = {**os.environ, "PYTHON": str(tmp_path / "python3"), "KUBE_SYNCER_VENV": str(tmp_path / "venv"),
           "PIP_LOG": str(log)}
    out = subprocess.run([str(ROOT / "dev"), "setup"], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    return out, log.read_text().splitlines()


def test_first_install_shows_progress_and_later_runs_are_quiet(tmp_path: Path) -> None:
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)

    first, pip = _setup(tmp_path)
    assert "first setup: installing kube-syncer and its dependencies" in first.stderr
    assert [line.split(" ", 1)[0] for line in pip] == ["PYTHONWARNINGS=ignore"] * 2
    assert not any(" -q " in line for line in pip), pip  # pip's own progress is shown
    assert any("install -e .[test,bench]" in line for line in pip), pip

    again, pip = _setup(tmp_path)
    assert (again.stdout, again.stderr, pip) == ("", "", [])

    # A changed setup.cfg reinstalls, quietly: the dependencies are there already.
    [stamp] = (tmp_path / "venv").glob(".installed-*")
    stamp.rename(stamp.with_name(".installed-old"))
    changed, pip = _setup(tmp_path)
    assert "first setup" not in changed.stderr and len(pip) == 2
    assert all(" -q " in line and line.startswith("PYTHONWARNINGS=ignore") for line in pip), pip
