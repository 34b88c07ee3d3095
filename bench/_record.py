"""The record every issue 23 benchmark writes: its command line, when it ran, on what, and its JSON file."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def start(script: str, args: Any) -> dict[str, Any]:
    """A new record: the command that reruns this run (from the repository root), its arguments, the start."""
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", f"bench/{script}", *sys.argv[1:]])
    return {"command": command, "args": vars(args), "started": _now()}


def write(record: dict[str, Any], path: str) -> None:
    """Stamp the end and the machine (with its load, since the machine is shared) and write the JSON."""
    record["finished"] = _now()
    record["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "platform": platform.platform(), "load_avg": os.getloadavg()}
    Path(path).write_text(json.dumps(record, indent=1, default=str))
    print(f"wrote {path}", file=sys.stderr)
