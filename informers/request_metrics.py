"""client-go's REST client metrics, for every open ApiClient: ``rest_client_requests_total{code,method,host}``
and ``rest_client_request_duration_seconds{verb,host}``.

A request is counted with plain additions on the event loop, and the families are built when the registry is
collected (prometheus_client's labelled counters cost microseconds per call, more than a watch event's
handling). As in client-go, the code of a request that got no answer is ``<error>``, and a watch is timed up to
its response headers. A host's series leave the exposition when its last client is closed, so a departed member
cluster leaves none behind; until then a closed client's counts stay in them, so counters never go down.
"""

from __future__ import annotations

import time
import urllib.parse
import weakref
from typing import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from .metrics import Histogram, MetricSet

# client-go's buckets for rest_client_request_duration_seconds.
_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0)
NO_ANSWER = "<error>"


class RequestCounts:
    """One client's requests, by (code, method), and their durations by method."""

    __slots__ = ("url", "host", "codes", "durations", "__weakref__")

    def __init__(self, url: str) -> None:
        self.url = ""
        self.host = ""
        self.codes: dict[tuple[str, str], int] = {}
        self.durations: dict[str, Histogram] = {}
        self.server(url)

    def server(self, url: str) -> None:
        """The client's server is ``url`` (the ``host`` label is its host:port), from now on."""
        if url != self.url:
            self.url, self.host = url, urllib.parse.urlsplit(url).netloc or url

    def observe(self, method: str, code: int | str, started: float) -> None:
        """Count a request of ``method`` that answered ``code`` (or ``NO_ANSWER``), sent at ``started``
        (``time.monotonic()``)."""
        key = (str(code), method)
        self.codes[key] = self.codes.get(key, 0) + 1
        histogram = self.durations.get(method)
        if histogram is None:
            histogram = self.durations[method] = Histogram(_BUCKETS)
        histogram.observe(time.monotonic() - started)


class _Collector(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.clients: "weakref.WeakSet[RequestCounts]" = weakref.WeakSet()
        # What closed clients counted, per host, while another client of that host is open: its series go on
        # from there instead of falling (which a rate() would read as a reset), and go when the host's last does.
        self.retired: dict[str, RequestCounts] = {}
        registry.register(self)

    def untrack(self, counts: RequestCounts) -> None:
        if counts not in self.clients:  # closed twice, or never used
            return
        self.clients.discard(counts)
        others = any(c.host == counts.host for c in self.clients)
        if not others:
            self.retired.pop(counts.host, None)
            return
        retired = self.retired.get(counts.host)
        if retired is None:
            retired = self.retired[counts.host] = RequestCounts(counts.url)
        for key, n in counts.codes.items():
            retired.codes[key] = retired.codes.get(key, 0) + n
        for method, histogram in counts.durations.items():
            into = retired.durations.setdefault(method, Histogram(_BUCKETS))
            into.counts = [a + b for a, b in zip(into.counts, histogram.counts)]
            into.total += histogram.total

    def collect(self) -> Iterator[Metric]:
        totals: dict[tuple[str, str, str], int] = {}
        durations: dict[tuple[str, str], list[Histogram]] = {}
        live_hosts = {c.host for c in self.clients}
        for counts in [*self.clients, *(r for h, r in self.retired.items() if h in live_hosts)]:
            for (code, method), n in counts.codes.items():
                key = (code, method, counts.host)
                totals[key] = totals.get(key, 0) + n
            for method, histogram in counts.durations.items():
                durations.setdefault((method, counts.host), []).append(histogram)
        requests = CounterMetricFamily("rest_client_requests", "Number of HTTP requests, partitioned by status "
                                       "code, method, and host.", labels=["code", "method", "host"])
        for (code, method, host), n in sorted(totals.items()):
            requests.add_metric([code, method, host], n)
        latency = HistogramMetricFamily("rest_client_request_duration_seconds", "Request latency in seconds. "
                                        "Broken down by verb, and host.", labels=["verb", "host"])
        for (verb, host), histograms in sorted(durations.items()):
            latency.add_metric([verb, host], Histogram.buckets(histograms), sum(h.total for h in histograms))
        yield requests
        yield latency


def track(counts: RequestCounts, registry: CollectorRegistry | None = None) -> None:
    """Export ``counts`` on ``registry`` (default: prometheus_client's global one) until ``untrack``."""
    _Collector.for_registry(registry or REGISTRY).clients.add(counts)


def untrack(counts: RequestCounts, registry: CollectorRegistry | None = None) -> None:
    """Take ``counts`` out of the exposition (its counts stay in the host's series while that host has another
    open client)."""
    _Collector.for_registry(registry or REGISTRY).untrack(counts)
