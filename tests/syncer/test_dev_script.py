"""``./dev``'s setup as a new user meets it: the first install shows pip's progress (not a block of setuptools
warnings from the editable build), later runs print nothing. The Python it runs is a stub that records the pip
commands, so the test needs no network and takes a second."""

from __future__ import annotations

import os
import shutil
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
    assert any("install -e .[test,bench,tracing]" in line for line in pip), pip

    again, pip = _setup(tmp_path)
    assert (again.stdout, again.stderr, pip) == ("", "", [])

    # A changed setup.cfg reinstalls, quietly: the dependencies are there already.
    [stamp] = (tmp_path / "venv").glob(".installed-*")
    stamp.rename(stamp.with_name(".installed-old"))
    changed, pip = _setup(tmp_path)
    assert "first setup" not in changed.stderr and len(pip) == 2
    assert all(" -q " in line and line.startswith("PYTHONWARNINGS=ignore") for line in pip), pip


# `./dev test`'s browser step, on a PATH of stand-ins: `id` says who runs it, `apt-get` records its arguments and
# installs a `chromium` when told to (after an update, with FAIL_UNTIL_UPDATE), and the python stub's pytest
# passes. No real package is installed and no network is used.
ID_STUB = '#!/bin/sh\necho "$DEV_UID"\n'
APT_STUB = """#!/bin/sh
echo "$*" >> "$APT_LOG"
case "$*" in
  *update*) touch "$APT_LOG.updated" ;;
  *install*)
    [ "$APT_WORKS" = yes ] || exit 100
    [ -n "$FAIL_UNTIL_UPDATE" ] && [ ! -f "$APT_LOG.updated" ] && exit 100
    printf '#!/bin/sh\\n' > "$(dirname "$0")/chromium" && chmod +x "$(dirname "$0")/chromium" ;;
esac
"""


def _dev_test(tmp_path: Path, uid: int, apt: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """``./dev test`` with only the tools it needs on PATH (no chromium), as ``uid``; ``apt``: "works",
    "after-update", "fails" or "none" (no apt-get)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("bash", "dirname", "cat", "sha256sum", "cut", "rm", "touch", "ls", "mkdir", "cp", "chmod", "sh"):
        link = bin_dir / tool
        if not link.exists():
            link.symlink_to(shutil.which(tool) or f"/bin/{tool}")
    (bin_dir / "id").write_text(ID_STUB)
    (bin_dir / "id").chmod(0o755)
    (bin_dir / "chromium").unlink(missing_ok=True)
    (bin_dir / "apt-get").unlink(missing_ok=True)
    if apt != "none":
        (bin_dir / "apt-get").write_text(APT_STUB)
        (bin_dir / "apt-get").chmod(0o755)
    stub = tmp_path / "python3"
    stub.write_text(STUB)
    stub.chmod(0o755)
    log = tmp_path / "apt.log"
    log.write_text("")
    Path(f"{log}.updated").unlink(missing_ok=True)
    run_env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "PYTHON": str(stub),
               "KUBE_SYNCER_VENV": str(tmp_path / "venv"), "PIP_LOG": str(tmp_path / "pip.log"),
               "APT_LOG": str(log), "DEV_UID": str(uid), "APT_WORKS": "no" if apt == "fails" else "yes",
               **({"FAIL_UNTIL_UPDATE": "1"} if apt == "after-update" else {}), **env}
    out = subprocess.run([str(ROOT / "dev"), "test"], capture_output=True, text=True, env=run_env, timeout=30)
    return out, log.read_text().splitlines()


def test_dev_test_installs_chromium_or_says_how(tmp_path: Path) -> None:
    # As root with apt-get: installed (an update first when the lists are missing), one line saying so.
    for apt, calls in (("works", 1), ("after-update", 3)):
        out, apt_calls = _dev_test(tmp_path, 0, apt)
        assert out.returncode == 0, out.stderr
        assert len(apt_calls) == calls and "install -y -qq chromium" in apt_calls[-1], apt_calls
        assert [line for line in out.stderr.splitlines() if "chromium" in line] == [
            "dev: installing chromium (Debian's package) for the status page's browser test"], out.stderr
    # Present: nothing to do, nothing said.
    out, apt_calls = _dev_test(tmp_path, 0, "works", KUBE_SYNCER_CHROMIUM="sh")
    assert (out.returncode, apt_calls) == (0, []) and "chromium" not in out.stderr, out.stderr
    # Where it cannot be installed (not root, no apt-get, apt-get failing): one line says how; the tests still run.
    how = ("the status page's browser test will be skipped; install it with 'apt-get install chromium' as root, or "
           "set KUBE_SYNCER_CHROMIUM to a Chromium or Chrome")
    for uid, apt in ((1000, "works"), (0, "none"), (0, "fails")):
        out, apt_calls = _dev_test(tmp_path, uid, apt)
        assert out.returncode == 0, out.stderr
        assert out.stderr.splitlines()[-1] == f"dev: no chromium: {how}", out.stderr
        assert apt_calls == ([] if uid or apt == "none" else ["install -y -qq chromium", "update -qq",
                                                               "install -y -qq chromium"]), apt_calls
