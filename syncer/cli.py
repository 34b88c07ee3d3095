"""The ``syncer`` command line."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .testing.assets import AssetsError
from .testing.controlplane import ControlPlane, ControlPlaneError


def _controlplane(args: argparse.Namespace) -> int:
    try:
        cp = ControlPlane(extra_apiserver_flags=args.apiserver_flag).start()
    except (AssetsError, ControlPlaneError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"local control plane ready at {cp.url}\n"
          f"  kubeconfig: {cp.kubeconfig}  (contexts: admin [current], restricted)\n"
          f"  try:        {cp.assets.kubectl} --kubeconfig {cp.kubeconfig} get namespaces\n"
          f"Ctrl-C stops it and removes its data.", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("stopping control plane", flush=True)
    cp.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``syncer`` console script and ``python -m syncer``."""
    parser = argparse.ArgumentParser(prog="syncer", description="kube-syncer: dynamic Kubernetes controllers")
    sub = parser.add_subparsers(dest="command", required=True)
    cp = sub.add_parser("controlplane", help="run a local etcd + kube-apiserver until Ctrl-C")
    cp.add_argument("--apiserver-flag", action="append", default=[], metavar="FLAG",
                    help="extra kube-apiserver flag (repeatable)")
    cp.set_defaults(func=_controlplane)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
