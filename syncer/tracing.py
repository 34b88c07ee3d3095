"""The sidecar's tracing: the ``[tracing]`` settings made into an OpenTelemetry ``TracerProvider`` that exports
with OTLP over HTTP, installed (``controllers/tracing.py``) for the work done inside ``traced``, and shut down,
its queued spans flushed, when that work ends.

Off (the default), nothing of OpenTelemetry is imported and every span is the one that does nothing. OTLP over
HTTP rather than gRPC: it needs no grpcio (a compiled wheel of its own), and every collector takes both.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, AsyncIterator

from loguru import logger

from controllers.tracing import reset_tracing, use_tracing

from .settings.tables import Tracing as TracingSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

DEFAULT_SERVICE_NAME = "kube-syncer"


@asynccontextmanager
async def traced(settings: TracingSettings) -> AsyncIterator[None]:
    """Trace the work done inside (the tasks started there inherit it) as ``settings`` say; on leaving, shut the
    provider down, which exports what is queued (bounded by the exporter's timeout, ``OTEL_EXPORTER_OTLP_TIMEOUT``,
    10 s by default), off the event loop."""
    if not settings.enabled:
        yield
        return
    from controllers.otel_tracing import OtelTracing

    provider = tracer_provider(settings)
    token = use_tracing(OtelTracing(provider))
    try:
        yield
    finally:
        reset_tracing(token)
        await asyncio.to_thread(provider.shutdown)


def tracer_provider(settings: TracingSettings) -> TracerProvider:
    """The SDK's provider for ``settings``: a batching OTLP/HTTP exporter, the service's resource and sampler, each
    from its setting when given, else from the ``OTEL_*`` environment variables as the SDK reads them."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from informers import __version__

    resource = Resource.create({SERVICE_VERSION: __version__})
    if settings.service_name:
        resource = resource.merge(Resource({SERVICE_NAME: settings.service_name}))
    elif str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):  # the SDK's default
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    sampler = ParentBased(TraceIdRatioBased(settings.sampling_ratio)) if settings.sampling_ratio is not None else None
    endpoint = settings.endpoint.rstrip("/") + "/v1/traces" if settings.endpoint else None
    exporter = OTLPSpanExporter(endpoint=endpoint)  # None: the environment's, else localhost:4318
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    logger.info("tracing: spans of service {} exported with OTLP/HTTP to {}{}", resource.attributes[SERVICE_NAME],
                endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318") + "/v1/traces",
                f", sampling {settings.sampling_ratio:g}" if settings.sampling_ratio is not None else
                f" (sampler: {os.environ.get('OTEL_TRACES_SAMPLER', 'parentbased_always_on')})")
    return provider
