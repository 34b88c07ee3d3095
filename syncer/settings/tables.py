"""The tables of settings as typed, frozen dataclasses: what ``load_settings`` returns, and the defaults."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from enum import StrEnum
from typing import Any, Literal

from controllers.read_your_writes import DEFAULT_READ_YOUR_WRITES
from controllers.providers.cluster_api import ClusterAPIOptions
from controllers.providers.cluster_profile import ClusterProfileOptions
from controllers.providers.kubeconfig_files import KubeconfigFilesOptions
from controllers.providers.namespaces import HostNamespacesOptions
from controllers.providers.secrets import DEFAULT_LABEL_SELECTORS, DEFAULT_SECRET_TYPES
from informers.discovering_factory import WatchMode

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
MAX_WORKERS = 1000
MAX_BUCKETS = 1024  # sharding.buckets: beyond this, the Lease writes no longer stay small


@dataclass(frozen=True)
class LeaderElection:
    """Lease-based leader election, table ``[leader_election]`` (controller-runtime's defaults).

    - ``enabled``: run controllers only while holding the Lease (off: every replica runs them).
    - ``lease_name`` (a DNS-1123 subdomain), ``lease_namespace`` (a DNS-1123 label): the Lease object.
    - ``lease_duration``: how long a standby waits after the last renewal before taking over.
    - ``renew_deadline``: the leader gives up if it cannot renew for this long; ``< lease_duration``.
    - ``retry_period``: the interval of acquire and renew attempts; ``< renew_deadline``.
    """

    enabled: bool = False
    lease_name: str = "kube-syncer"
    lease_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


@dataclass(frozen=True)
class Webhooks:
    """The admission webhook server, table ``[webhooks]``; it runs, on every replica, when a plugin declares
    webhooks.

    - ``bind``: ``host:port`` it listens on with TLS (in a pod: ``0.0.0.0:9443``, for the API server to reach).
    - ``cert_dir``: a directory with ``tls.crt``, ``tls.key`` and ``ca.crt`` (a mounted cert-manager Secret),
      reloaded when they change; ``""``: a self-signed certificate (and CA) for ``hosts``.
    - ``hosts``: the DNS names and IP addresses of the self-signed certificate.
    - ``client_ca_file``: require client certificates signed by this CA (the API server's, mutual TLS);
      ``""``: none required.
    - ``manage_configurations``: write the ``Validating``/``MutatingWebhookConfiguration`` objects from the
      plugins' declarations: ``true``, ``false`` or ``"auto"`` (when the API server is on loopback, as with
      ``syncer run --local``).
    - ``configuration_name`` (a DNS-1123 subdomain): the name of both objects.
    - ``url``: the ``https://`` base URL the API server calls in them; ``""``: ``https://`` + ``bind``, with
      ``127.0.0.1`` for ``0.0.0.0``.
    - ``probe_namespace`` (a DNS-1123 label): the namespace of the dry-run ConfigMap that shows the API server
      calls the webhooks (nothing is created).
    """

    bind: str = "127.0.0.1:9443"
    cert_dir: str = ""
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
    client_ca_file: str = ""
    manage_configurations: bool | Literal["auto"] = "auto"
    configuration_name: str = "kube-syncer"
    url: str = ""
    probe_namespace: str = "default"


@dataclass(frozen=True)
class Clusters:
    """Multi-cluster mode, table ``[clusters]``: member clusters come from the cluster providers (by default the
    kubeconfig Secrets on the cluster the sidecar connects to, the management cluster), and the plugins'
    controllers run in each of them.

    - ``enabled``: on (off: the plugins' controllers run in the one cluster the sidecar connects to).
    - ``providers``: where members come from, in precedence order (a cluster name two providers claim goes to
      the first listed; the other's claim is a conflict): ``"secrets"`` (kubeconfig Secrets, chosen by the
      three settings below), ``"cluster-api"`` (see ``ClusterAPI``), ``"kubeconfig-files"`` (see
      ``KubeconfigFiles``), ``"cluster-profile"`` (see ``ClusterProfile``), ``"host-namespaces"`` (see
      ``HostNamespaces``). The local cluster (``include_local``) is a provider of its own, allowed with any
      list; ``[]`` only with it. A provider's table is checked even when it is not listed, and then unused.
    - ``namespaces``: where the Secrets are (DNS-1123 labels; ``[]``: all namespaces).
    - ``label_selectors``: each selects Secrets by label; ``secret_types``: each selects Secrets by type.
    - ``include_local``: the management cluster is a member too, named ``""``.
    - ``allowed_exec_commands``: exec credential plugins a kubeconfig may run (exact command names); none by
      default, because a kubeconfig read from the cluster (a Secret, a Cluster API Secret) is untrusted input.
      It does not apply to kubeconfig files, which are the operator's own and trusted as ``kubectl`` trusts
      them.
    - ``sync_timeout``: how long a member may take to connect, discover and sync before its controllers start
      anyway (connect and discovery failures are retried with backoff).
    - ``probe_interval``: how long a member's watches may say nothing (no event, no bookmark, no answer to any
      request) before ``/version`` is asked whether it is still there. Above the API server's bookmark cadence
      (a minute) and the watches' inactivity timeout (150 s, after which a silent watch is reopened) by default,
      so a member with a working watch is never asked: its watches say when it is unreachable.
    - ``watch``: which served GVRs get informers in member clusters, the management cluster included (it runs
      nothing of its own in this mode): ``"required"`` (those some controller requires) or ``"all"``; the
      top-level ``watch`` applies only without ``[clusters]``.
    - ``cluster_api``, ``kubeconfig_files``, ``cluster_profile``, ``host_namespaces``: the providers' own tables,
      their options dataclasses (``ClusterAPIOptions``, ``KubeconfigFilesOptions``, ``ClusterProfileOptions``,
      ``HostNamespacesOptions``); each kind is registered in ``providers.py``.
    """

    enabled: bool = False
    providers: tuple[str, ...] = ("secrets",)
    namespaces: tuple[str, ...] = ()
    label_selectors: tuple[str, ...] = DEFAULT_LABEL_SELECTORS
    secret_types: tuple[str, ...] = DEFAULT_SECRET_TYPES
    include_local: bool = False
    allowed_exec_commands: tuple[str, ...] = ()
    sync_timeout: float = 30.0
    probe_interval: float = 300.0
    watch: WatchMode = "required"
    cluster_api: ClusterAPIOptions = field(default_factory=ClusterAPIOptions)
    kubeconfig_files: KubeconfigFilesOptions = field(default_factory=KubeconfigFilesOptions)
    cluster_profile: ClusterProfileOptions = field(default_factory=ClusterProfileOptions)
    host_namespaces: HostNamespacesOptions = field(default_factory=HostNamespacesOptions)


class UnitKind(StrEnum):
    """What the shard coordinator spreads over the replicas (``Sharding.unit_kind``)."""

    CLUSTERS = "clusters"
    CONTROLLERS = "controllers"


@dataclass(frozen=True)
class Tracing:
    """OpenTelemetry tracing, table ``[tracing]`` (the ``kube-syncer[tracing]`` extra): a span per reconcile, per
    API request it makes, and per webhook call, exported with OTLP over HTTP. The SDK's ``OTEL_*`` environment
    variables apply (``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``, ...); a setting
    given here wins over the variable of the same meaning.

    - ``enabled``: trace (it needs the extra: ``pip install 'kube-syncer[tracing]'``).
    - ``endpoint``: the collector's OTLP/HTTP base URL (``http://collector:4318``; ``/v1/traces`` is appended);
      ``""``: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``, else
      ``http://localhost:4318``.
    - ``service_name``: the ``service.name`` of the spans; ``""``: ``OTEL_SERVICE_NAME``, else ``kube-syncer``.
    - ``sampling_ratio``: the fraction of traces kept, from 0 to 1 (a webhook call follows the API server's
      decision when it sends one); unset: ``OTEL_TRACES_SAMPLER``'s sampler, by default every trace.
    """

    enabled: bool = False
    endpoint: str = ""
    service_name: str = ""
    sampling_ratio: float | None = None


@dataclass(frozen=True)
class Sharding:
    """Scale-out, table ``[sharding]``: the replicas share the work, each unit of it fenced by its own Lease
    (see ``syncer/sharding/coordinator.py``).

    - ``enabled``: on (off: the leader, or with election off every replica, runs all the controllers).
    - ``units``: what is spread: ``"clusters"`` (each member cluster with its controllers; needs ``[clusters]``
      enabled), ``"controllers"`` (each managed controller; without ``[clusters]``) or ``"auto"`` (whichever
      the mode allows).
    - ``group`` (a DNS-1123 label): names the Leases (``<group>-member-...``, ``<group>-bucket-...``,
      ``<group>-unit-...``) and labels them; replicas of one deployment share it, and two deployments in one
      namespace must not.
    - ``lease_namespace`` (a DNS-1123 label): where the member and bucket Leases are.
    - ``lease_duration``, ``renew_deadline`` (< ``lease_duration``), ``retry_period`` (< ``renew_deadline``): as
      for leader election, for every member and bucket Lease.
    - ``min_hold``: a bucket stays at least this long with the replica that took it before it is handed to another
      (so a member that blips does not make work flap).
    - ``buckets``: member clusters are hashed into this many buckets, and a bucket (all its members) is what a
      Lease fences and what moves between replicas, so the Lease writes stay ``(buckets + replicas) /
      retry_period`` however many members there are; 0 gives every member a Lease of its own. Managed
      controllers are few: each always has its own Lease. Every replica of a group must use the same value.
    """

    enabled: bool = False
    units: Literal["auto", "clusters", "controllers"] = "auto"
    group: str = "kube-syncer"
    lease_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    min_hold: float = 30.0
    buckets: int = 60

    def bucket_count(self, kind: str) -> int:
        """How many buckets units of ``kind`` are hashed into (0: a Lease per unit): managed controllers always have
        one each."""
        return 0 if kind == UnitKind.CONTROLLERS else self.buckets

    def unit_kind(self, clusters_enabled: bool) -> UnitKind:
        """What is spread, ``auto`` resolved."""
        if self.units == "auto":
            return UnitKind.CLUSTERS if clusters_enabled else UnitKind.CONTROLLERS
        return UnitKind(self.units)


@dataclass(frozen=True)
class Settings:
    """The validated, typed settings of a syncer process. Durations are seconds, written ``15s``, ``500ms``,
    ``2m``, ``1h`` or as a number of seconds, and must be > 0 unless said otherwise.

    - ``kubeconfig``, ``context``: credentials file (default ``$KUBECONFIG`` or ``~/.kube/config``) and context;
      ``in_cluster``: use the pod's service account instead.
    - ``plugins``: plugin modules (dotted paths or ``.py`` files); ``entry_point_plugins``: whether installed
      packages' ``syncer.controllers`` entry points are loaded too: ``true`` (all), ``false`` (none) or a list
      of entry point names; ``plugin_settings``: one table per plugin, ``[plugin_settings.<plugin name>]``.
    - ``field_selectors``: per GVR, a field selector the server filters that GVR's informer by (in every
      cluster), so its cache holds only those objects: controller-runtime's ``cache.Options.ByObject``.
    - ``include``, ``exclude``: resource rules (``group/version/resource`` or ``group/resource``, globs
      allowed) choosing the GVRs that get informers; ``preferred_version_only``: only each group's preferred
      version; ``namespace``: watch one namespace (a DNS-1123 label; ``""`` = all namespaces).
    - ``rediscovery_interval``: how often discovery is re-run while CRD/APIService events cannot say when (they
      cannot be watched, or ``check_permissions`` found a GVR forbidden); ``full_rediscovery_interval`` (at
      least ``rediscovery_interval``): how often it is re-run anyway, as a safety net, while they can (plus up
      to 20 % jitter; in every cluster). ``resync``:
      informer resync period (``0`` = off); ``check_permissions``: skip GVRs the credentials cannot list/watch.
    - ``workers``: reconcile workers per controller, 1 to ``MAX_WORKERS``; ``priority_queue``: controllers' work
      queues serve live changes before the objects of initial lists (a controller starting, a member cluster
      joining) and resyncs, as controller-runtime's default priority queue (off: client-go's FIFO queue).
      ``read_your_writes``: how long at most a reconcile waits until the writes that earlier reconciles of its
      request made show in the controller's caches (``0`` = off: it reads whatever the caches hold).
    - ``http_bind``: ``host:port`` (port 1-65535) of the probes, ``/metrics`` and ``/status``.
    - ``log_level`` (any case of ``LOG_LEVELS``), ``log_format`` (``text`` or ``json``); ``log_libraries``: the
      level of named standard-library loggers. The libraries that see requests on the wire (hpack, h2, aiohttp,
      urllib3, kubernetes, ...) log at WARNING whatever ``log_level`` says unless named here; every line is
      redacted of credentials either way.
    - ``shutdown_timeout``: the bound on a graceful stop; ``start_timeout``: the bound on starting the
      controllers after becoming leader.
    - ``uvloop``: run ``syncer run`` on uvloop when it is installed (off: the standard asyncio loop).
    - ``http2``: talk to every API server (the local one and the members) over HTTP/2 when it offers it, one
      connection per server for all requests and watches, as client-go; off: HTTP/1.1, a connection per watch.
      client-go's ``DISABLE_HTTP2`` environment variable turns it off too.
    - ``debug_endpoints``: also serve ``/debug/tasks`` (every asyncio task's stack) and ``/debug/stalls`` (where
      the event loop was when it stalled) on ``http_bind``.
    - ``watch``: which served (and filtered) GVRs get informers: ``"all"``, or ``"required"``: only those some
      controller requires (fewer watches; ``syncer status`` shows the others as idle).
    - ``warm_standby``: a replica keeps synced the informers of the work it may run next, so that this work starts
      on synced caches, without listing: with leader election, a standby those its controllers require (in
      multi-cluster mode, in every member: it runs the cluster registry, not the controllers); with sharded
      controllers, a replica those of the controllers assigned to it, before it holds them (with sharded member
      clusters, it connects to the members assigned to it and syncs theirs). Off: a replica
      watches only what ``watch`` and its running work need, and lists the rest when it takes over (less memory
      and API load per standby).
    - ``leader_election``: see ``LeaderElection``; ``webhooks``: see ``Webhooks``; ``clusters``: see
      ``Clusters``; ``sharding``: see ``Sharding``; ``tracing``: see ``Tracing``. ``source``: the settings
      file read (not a setting).
    """

    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False
    plugins: tuple[str, ...] = ()
    entry_point_plugins: bool | tuple[str, ...] = True
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    preferred_version_only: bool = False
    namespace: str = ""
    rediscovery_interval: float = 60.0
    full_rediscovery_interval: float = 600.0
    resync: float = 0.0
    workers: int = 2
    priority_queue: bool = True
    read_your_writes: float = DEFAULT_READ_YOUR_WRITES
    check_permissions: bool = False
    http_bind: str = "127.0.0.1:8080"
    log_level: str = "INFO"
    log_format: str = "text"
    log_libraries: dict[str, str] = field(default_factory=dict)
    shutdown_timeout: float = 20.0
    start_timeout: float = 60.0
    uvloop: bool = True
    http2: bool = True
    debug_endpoints: bool = False
    watch: WatchMode = "all"
    warm_standby: bool = True
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    webhooks: Webhooks = field(default_factory=Webhooks)
    clusters: Clusters = field(default_factory=Clusters)
    sharding: Sharding = field(default_factory=Sharding)
    tracing: Tracing = field(default_factory=Tracing)
    field_selectors: dict[str, str] = field(default_factory=dict)
    plugin_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""

    def masked(self) -> dict[str, Any]:
        """The effective settings as a dict, with anything secret-looking masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = _mask(f.name, asdict(value) if is_dataclass(value) and not isinstance(value, type) else value)
        return out



def _mask(key: str, value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _mask(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask(key, v) for v in value]
    # By the end of the name: "api_token" or "client_secret" are secrets, "secret_types" is not.
    if value and re.search(r"(token|password|secret|key)s?$", key, re.I):
        return "***"
    return value
