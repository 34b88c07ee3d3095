"""``syncer run`` and ``syncer controlplane``: the commands that run until they are stopped."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
import threading
from typing import Any, Callable

from loguru import logger

from ..logs import setup_logging
from ..settings import Settings
from ..tracing import traced
from .common import UsageError, client_of, plugins_of, refuse_fleet_with_sharding, settings_of
from .local import cluster_count, start_local_planes, stop_planes, use_local_planes


def event_loop(settings: Settings) -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """The loop factory for ``syncer run`` (None: asyncio's default) and a note on which loop that is and why.

    Only the sidecar picks its loop: it owns the process, whereas library users run the informers on theirs.
    """
    if not settings.uvloop:
        return None, "asyncio (setting 'uvloop' is false)"
    try:
        import uvloop
    except ImportError as e:  # an optional speed-up: its absence must not stop the sidecar
        return None, f"asyncio, not uvloop: it cannot be imported ({e}); install uvloop, or set uvloop = false"
    # uvloop's own __version__ (not exported for mypy): importlib.metadata would cost ~0.8 MiB of RSS.
    return uvloop.new_event_loop, f"uvloop {getattr(uvloop, '__version__', 'of unknown version')}"


# The sidecar's garbage collector: young collections every GC_THRESHOLD container allocations instead of
# CPython's 700, and what start-up made (modules, settings, plugins) moved out of the collector's sight with
# gc.freeze(). Bringing a fleet up allocates millions of containers, nearly all of them acyclic and freed by
# reference counting; at 700 the collector ran ~2,700 times and took half a second of the 2.7 s of CPU 200 members
# cost (bench/RESULTS-fleet.md). Only the process owner decides this, as for the loop.
GC_THRESHOLD = 20_000


def tune_gc() -> None:
    """Set this process's collector for a long-running sidecar (see GC_THRESHOLD); call once start-up is done."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, older, oldest)


def cmd_run(args: argparse.Namespace) -> int:
    """``syncer run``: the sidecar until SIGTERM or Ctrl-C (with ``--local``, against local control planes)."""
    from ..runtime import ControllersStuck, StartupError, Syncer

    count = cluster_count(args)
    settings = settings_of(args)
    setup_logging(settings.log_level, settings.log_format, settings.log_libraries)
    controllers = plugins_of(settings)
    refuse_fleet_with_sharding(settings, controllers)
    planes: list[Any] = []
    if args.local:
        from ..testing import AssetsError, ControlPlaneError  # test tooling: only when asked for

        try:
            planes = start_local_planes(count)
        except (AssetsError, ControlPlaneError) as e:
            print(f"error: local control plane: {e}", file=sys.stderr)
            return 1
    try:
        if planes:
            import kubernetes  # the local planes are set up with the package's client

            try:
                settings = use_local_planes(settings, planes)
            except kubernetes.client.ApiException as e:  # a fresh plane refusing this is our bug, not the user's
                print(f"error: registering the workload planes on the local control plane: {e.status} {e.reason}",
                      file=sys.stderr)
                return 1
        client = client_of(settings)

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            try:
                async with traced(settings.tracing):
                    await Syncer(settings, client, controllers, identity=args.identity).run(stop)
            except ControllersStuck as e:
                # asyncio.run would wait forever for the tasks that ignore their cancellation: leave now.
                print(f"error: {e}", file=sys.stderr, flush=True)
                os._exit(1)

        loop_factory, which = event_loop(settings)
        logger.info("event loop: {}", which)
        tune_gc()
        try:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                runner.run(main())
        except StartupError as e:
            raise UsageError(str(e)) from None
    finally:
        stop_planes(planes)
    return 0


def cmd_controlplane(args: argparse.Namespace) -> int:
    """``syncer controlplane``: a local etcd and kube-apiserver until Ctrl-C."""
    from ..testing import AssetsError, ControlPlane, ControlPlaneError  # test tooling: only when asked for

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
