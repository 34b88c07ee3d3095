"""The README's opening walk-through, as a new user pastes it: ``./dev run --settings FILE`` in one terminal, the
README's "another terminal" block line by line in a second one (with the kubeconfig path the first printed), then
Ctrl-C; what ``./dev run`` printed is what the README shows, in its order. FILE is ``examples/settings.toml`` on a
free port, so the test does not collide with a real 8080."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_SETTINGS = "examples/settings.toml"


def _terminal_block() -> list[str]:
    """The lines of the README's sh block that follows "in another terminal"."""
    readme = (ROOT / "README.md").read_text()
    after = readme[readme.index("What a user then does in another terminal"):]
    block = re.search(r"```sh\n(.*?)```", after, re.S)
    assert block, "no sh block after 'What a user then does in another terminal'"
    return block.group(1).strip().splitlines()


def _transcript() -> list[re.Pattern[str]]:
    """The log lines (``... LEVEL message``) of the README's text blocks between "What `./dev run` shows" and the
    terminal block, as patterns: ``...`` stands for anything (a timestamp, an identity), every number for any."""
    readme = (ROOT / "README.md").read_text()
    shown = readme[readme.index("What `./dev run` shows"):readme.index("What a user then does in another terminal")]
    lines = [line for block in re.findall(r"```text\n(.*?)```", shown, re.S) for line in block.splitlines()
             if line.startswith("... ")]
    assert lines, "no log lines in the README's transcript of ./dev run"
    return [re.compile(re.sub(r"\d+", r"\\d+", re.escape(line)).replace(re.escape("..."), ".*?")) for line in lines]


def test_the_readme_walk_through_pastes_line_by_line(tmp_path: Path) -> None:
    settings = tmp_path / "settings.toml"
    port = free_port()
    settings.write_text((ROOT / EXAMPLE_SETTINGS).read_text().replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",) and not k.startswith("SYNCER_")}
    log = tmp_path / "run.log"
    run = subprocess.Popen([str(ROOT / "dev"), "run", "--settings", str(settings)], cwd=ROOT, env=env,
                           stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120  # the local control plane starts first
        while not (found := re.search(r"kubeconfig: (\S+)", log.read_text())):
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        kubeconfig = found.group(1)

        lines = _terminal_block()
        assert any(line.startswith("export KUBECONFIG=") for line in lines)
        script = []
        for line in lines:
            if line.startswith("export KUBECONFIG="):
                line = f"export KUBECONFIG={kubeconfig}"
            script.append(line.replace(EXAMPLE_SETTINGS, str(settings)))
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(script)], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n--- ./dev run:\n{log.read_text()[-3000:]}"
        assert re.search(r"^3$", out.stdout, re.M), out.stdout  # the Widget's ConfigMap holds its size
        assert re.search(r"^widget-status\s+running", out.stdout, re.M), out.stdout
        assert re.search(r"^configmap-mirror\s+running", out.stdout, re.M), out.stdout
        text = log.read_text()
        expected = _transcript()
        for line in text.splitlines():
            if expected and expected[0].fullmatch(line):
                expected.pop(0)
        assert not expected, f"not printed (in the README's order): {expected[0].pattern}\n--- ./dev run:\n{text}"
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 0, log.read_text()[-3000:]
