"""The ``syncer`` command line: run, check-config, discover, status, version, controlplane.

User mistakes (settings, plugins, kubeconfig) end with one ``error:`` line and exit code 2, before anything
connects to the API server.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from ..settings import SETTINGS_ENV
from .common import EXIT_USAGE, Unreachable, UsageError
from .info import cmd_check_config, cmd_discover, cmd_settings, cmd_version, version_line
from .local import LOCAL_CLUSTERS_NAMESPACE
from .run import cmd_controlplane, cmd_run, event_loop, tune_gc
from .status import cmd_status

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_INTERRUPTED", "EXIT_USAGE", "UsageError", "event_loop", "main", "tune_gc"]

EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``syncer`` console script and ``python -m syncer``."""
    parser = argparse.ArgumentParser(prog="syncer", description="kube-syncer: dynamic Kubernetes controllers")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)

    def with_settings(p: argparse.ArgumentParser, cluster: bool = True) -> argparse.ArgumentParser:
        p.add_argument("--settings", metavar="FILE", help=f"settings TOML file (default: ${SETTINGS_ENV})")
        if cluster:
            p.add_argument("--kubeconfig", help="kubeconfig file (overrides the setting)")
            p.add_argument("--context", help="kubeconfig context (overrides the setting)")
        return p

    run = with_settings(sub.add_parser("run", help="run the sidecar"))
    run.add_argument("--local", action="store_true", help="start a local control plane and run against it")
    run.add_argument("--identity", help="leader-election identity (default: hostname_uuid)")
    run.add_argument("--clusters", metavar="N",
                     help="with --local: also start N workload control planes and run in multi-cluster mode, each "
                          f"a member through a kubeconfig Secret in namespace {LOCAL_CLUSTERS_NAMESPACE}")
    run.set_defaults(func=cmd_run)
    check = with_settings(sub.add_parser("check-config", help="check settings, plugins and credentials without "
                                         "connecting; print the effective settings"))
    check.add_argument("--local", action="store_true",
                       help="the settings are for `run --local`: skip the credentials, a local control plane brings "
                            "its own")
    check.add_argument("--json", action="store_true", help="print the effective settings as JSON and nothing else")
    check.set_defaults(func=cmd_check_config)
    with_settings(sub.add_parser("discover", help="list served GVRs and whether they would be watched")
                  ).set_defaults(func=cmd_discover)
    status = with_settings(sub.add_parser("status", help="show a running sidecar's status"), cluster=False)
    status.add_argument("--url", help="status URL (default: from http_bind)")
    status.add_argument("--open", action="store_true",
                        help="print the URL of the status page, for a browser, once the sidecar answers there")
    status.set_defaults(func=cmd_status)
    sub.add_parser("settings", help="list every setting: default, type and range, environment variable"
                   ).set_defaults(func=cmd_settings)
    sub.add_parser("version", help="print the version").set_defaults(func=cmd_version)
    cp = sub.add_parser("controlplane", help="run a local etcd + kube-apiserver until Ctrl-C")
    cp.add_argument("--apiserver-flag", action="append", default=[], metavar="FLAG",
                    help="extra kube-apiserver flag (repeatable)")
    cp.set_defaults(func=cmd_controlplane)
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's final flush
        return code
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the command installed its own handling (e.g. while starting)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`syncer discover | head`): stop quietly, as Unix tools do. Point stdout at
        # /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
