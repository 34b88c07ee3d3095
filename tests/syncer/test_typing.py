"""The public packages stay mypy-clean (strict)."""

import subprocess
import sys
from pathlib import Path


def test_mypy_strict_on_public_packages() -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "mypy", "informers", "controllers", "syncer"],
                          cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
