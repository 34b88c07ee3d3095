"""Tracing (issue 32): what it costs a single-cluster controller, off (the default) and on.

Usage (cwd the repository):  .venv/bin/python bench/tracing_bench.py --kubeconfig K [--tracing off|on] \
                                 [--objects 300] [--steps 20]

One process is one measurement, to be timed whole from outside (``/usr/bin/time -v``, or a runner alternating two
commands), against an API server already running (``python -m syncer controlplane`` prints its kubeconfig). It
runs two of ``ryw_bench.py``'s scenarios, each a ``ControllerManager`` with one ``Controller`` over the
ConfigMaps of a fresh namespace holding ``--objects`` ConfigMaps (created before, not timed):

- ``write-once``: a reconcile reads its ConfigMap from the cache and merge-patches an annotation in while it lacks
  it (a reconcile with an API request: with tracing on, a span and a child span with ``traceparent``);
- ``requeue-read``: ``--steps`` reconciles per object, requeued at once, with no request (the reconcile path alone:
  with tracing off, the null span; on, a span each).

``--tracing on`` installs ``OtelTracing`` over the SDK's ``TracerProvider`` with a ``BatchSpanProcessor`` and an
exporter that drops what it is given (the SDK's cost without a network). Without ``--tracing`` (or ``off``) nothing
of tracing is imported, so the same command runs against a checkout from before tracing. Prints one JSON line per
scenario (wall and CPU seconds of this process from ``manager.start()`` to done, reconciles) and the spans
exported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loguru import logger  # noqa: E402

from informers import ApiClient  # noqa: E402
from ryw_bench import measure  # noqa: E402


def install_tracing() -> tuple[Any, list[int]]:
    """OtelTracing into an exporter that counts and drops; the provider (to shut down) and the count."""
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from controllers.otel_tracing import OtelTracing
    from controllers.tracing import use_tracing

    exported = [0]

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            exported[0] += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    use_tracing(OtelTracing(provider))
    return provider, exported


async def run(args: argparse.Namespace) -> None:
    provider, exported = install_tracing() if args.tracing == "on" else (None, [0])
    async with ApiClient.from_kubeconfig(args.kubeconfig) as api, \
            ApiClient.from_kubeconfig(args.kubeconfig) as client:
        for scenario in ("write-once", "requeue-read"):
            result = await measure(api, client, scenario, "on", args, 120)  # "on": read-your-writes, the default
            print(json.dumps({"tracing": args.tracing, "scenario": scenario,
                              **{k: result[k] for k in ("wall_s", "cpu_s", "reconciles")}}), flush=True)
    if provider is not None:
        await asyncio.to_thread(provider.shutdown)
    print(json.dumps({"tracing": args.tracing, "spans_exported": exported[0]}), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--tracing", choices=("off", "on"), default="off")
    p.add_argument("--objects", type=int, default=300)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    logger.remove()
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
