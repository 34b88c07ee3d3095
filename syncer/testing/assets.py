"""Locate or build the control-plane binaries (kube-apiserver, etcd, kubectl).

The versions are pinned by the Go module in ``gobuild/`` (shipped with the package). The first call builds
the three binaries with the local Go toolchain into the user's cache directory, keyed by the pinned versions
and a hash of ``go.mod``/``go.sum``; later calls reuse them. ``KUBE_SYNCER_ASSETS`` (or envtest's
``KUBEBUILDER_ASSETS``) points at a directory of existing binaries instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GOMOD_DIR = Path(__file__).parent / "gobuild"
BINARIES = ("kube-apiserver", "etcd", "kubectl")
_PACKAGES = {
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
    "etcd": "go.etcd.io/etcd/server/v3",
}
_MIN_GO = (1, 26)
# Bumped whenever the build command changes, so an old cache entry is not reused.
_BUILD_REV = "2"


class AssetsError(RuntimeError):
    """The control-plane binaries can be neither found nor built; the message says how to fix it."""


@dataclass(frozen=True)
class Assets:
    """Paths of the three control-plane binaries."""

    kube_apiserver: Path
    etcd: Path
    kubectl: Path


def pinned_versions() -> dict[str, str]:
    """Versions of kubernetes and etcd pinned by the shipped go.mod."""
    text = (GOMOD_DIR / "go.mod").read_text()
    found = {}
    for name, module in (("kubernetes", "k8s.io/kubernetes"), ("etcd", "go.etcd.io/etcd/server/v3")):
        m = re.search(rf"^\s*{re.escape(module)} (v\S+)", text, re.M)
        if not m:
            raise AssetsError(f"{GOMOD_DIR / 'go.mod'} does not pin {module}")
        found[name] = m.group(1)
    return found


def cache_dir() -> Path:
    """Directory the built binaries live in: ``$XDG_CACHE_HOME/kube-syncer/controlplane/<key>``."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    v = pinned_versions()
    digest = hashlib.sha256(_BUILD_REV.encode())
    for name in ("go.mod", "go.sum"):
        digest.update((GOMOD_DIR / name).read_bytes())
    return base / "kube-syncer" / "controlplane" / f"{v['kubernetes']}-etcd{v['etcd']}-{digest.hexdigest()[:10]}"


def _from_dir(directory: Path, origin: str) -> Assets:
    missing = [b for b in BINARIES if not os.access(directory / b, os.X_OK)]
    if missing:
        raise AssetsError(f"{origin}={directory} lacks executable {', '.join(missing)}")
    return Assets(directory / "kube-apiserver", directory / "etcd", directory / "kubectl")


def _check_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise AssetsError(
            "the Go toolchain (go >= 1.26) is needed to build kube-apiserver/etcd/kubectl but `go` is not on PATH: "
            "install Go from https://go.dev/dl, or set KUBE_SYNCER_ASSETS to a directory holding "
            "kube-apiserver, etcd and kubectl"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    m = re.match(r"go(\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < _MIN_GO:
        raise AssetsError(f"{go} is {out or 'of unknown version'}; building kubernetes needs go >= 1.26")
    return go


def ensure_assets(log: bool = True) -> Assets:
    """Return the binaries, building them into the cache on first use (minutes, once)."""
    for var in ("KUBE_SYNCER_ASSETS", "KUBEBUILDER_ASSETS"):
        if os.environ.get(var):
            return _from_dir(Path(os.environ[var]), var)
    target = cache_dir()
    if all(os.access(target / b, os.X_OK) for b in BINARIES):
        return _from_dir(target, "cache")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Two test sessions building at once would race on the same target: serialise on a lock file.
    with open(target.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(os.access(target / b, os.X_OK) for b in BINARIES):
            return _from_dir(target, "cache")
        _build(target, log)
    return _from_dir(target, "cache")


def _build(target: Path, log: bool) -> None:
    go = _check_go()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    if log:
        print(f"kube-syncer: building control plane {pinned_versions()} into {target} (first run only)",
              file=sys.stderr, flush=True)
    version = pinned_versions()["kubernetes"]
    major, minor = version.lstrip("v").split(".")[:2]
    # Stamp the real version (as the Kubernetes release build does) so clients that check it work.
    stamps = [f"-X {pkg}.{var}={val}" for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
              for var, val in (("gitVersion", version), ("gitMajor", major), ("gitMinor", minor),
                               ("gitTreeState", "clean"))]
    ldflags = " ".join(["-s", "-w", *stamps])
    cmd = [go, "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(staging), *_PACKAGES.values()]
    env = {**os.environ, "CGO_ENABLED": "0"}
    proc = subprocess.run(cmd, cwd=GOMOD_DIR, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-30:])
        raise AssetsError(f"building the control plane failed (`{' '.join(cmd)}` in {GOMOD_DIR}):\n{tail}")
    # go names the etcd binary after its module path without the major-version suffix: "server".
    (staging / "server").rename(staging / "etcd")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    if log:
        print(f"kube-syncer: control plane built in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)

