"""``syncer run --local [--clusters N]``: local control planes, the first the management cluster and the others
workload clusters, each of those a member through a kubeconfig Secret on the first."""

from __future__ import annotations

import argparse
import base64
import json
import threading
from dataclasses import replace
from typing import Any, Sequence

from ..settings import Settings
from .common import UsageError

# The example plugin whose CRD the `run --local` hint suggests installing.
_WIDGET_EXAMPLE = "examples.plugins.widget_status"
# Where `run --local --clusters N` puts the kubeconfig Secrets of its workload planes.
LOCAL_CLUSTERS_NAMESPACE = "kube-syncer-clusters"
MEMBER_LABEL = "kube-syncer.io/kubeconfig=true"


def cluster_count(args: argparse.Namespace) -> int:
    """The number of workload planes ``run --local --clusters N`` asks for (0 without the option)."""
    if args.clusters is None:
        return 0
    if not args.local:
        raise UsageError("--clusters starts local workload control planes: it needs --local (against real clusters, "
                         "set [clusters] enabled = true and create the kubeconfig Secrets)")
    if not (args.clusters.isascii() and args.clusters.isdigit()):
        raise UsageError(f"--clusters must be a whole number of workload clusters (0 or more), got {args.clusters!r}")
    return int(args.clusters)


def start_local_planes(count: int) -> list[Any]:
    """The management control plane and ``count`` workload planes (``workload-<i>``), all started or none.

    The workload planes start on threads beside the management one, so N planes take about as long as one; the
    management plane starts on this thread, so that Ctrl-C interrupts it at once (the planes still starting
    then die with the process, as every local plane does).
    """
    from ..testing import AssetsError, ControlPlane, ControlPlaneError  # test tooling: only when asked for

    planes: list[Any] = [None] * (count + 1)
    errors: list[Exception] = []

    def start(i: int) -> None:
        try:
            planes[i] = ControlPlane(name=f"workload-{i}").start()
        except (AssetsError, ControlPlaneError) as e:
            errors.append(type(e)(f"workload plane workload-{i}: {e}"))

    threads = [threading.Thread(target=start, args=(i,), name=f"start workload-{i}", daemon=True)
               for i in range(1, count + 1)]
    for t in threads:
        t.start()
    try:
        planes[0] = ControlPlane().start()
    except (AssetsError, ControlPlaneError) as e:
        errors.insert(0, e)
    for t in threads:
        t.join()
    if errors:
        stop_planes([p for p in planes if p is not None])
        raise errors[0]
    return planes


def stop_planes(planes: Sequence[Any]) -> None:
    """Stop the control planes side by side (each takes a second or two)."""
    threads = [threading.Thread(target=cp.stop, daemon=True) for cp in planes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _register_members(management: Any, workloads: Sequence[Any]) -> None:
    """Make each workload plane a member: a kubeconfig Secret ``cluster-<i>`` on the management plane."""
    import kubernetes

    k = kubernetes.client
    with kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            str(management.kubeconfig), context="admin") as api:
        core = k.CoreV1Api(api)
        core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name=LOCAL_CLUSTERS_NAMESPACE)))
        for i, cp in enumerate(workloads, 1):
            core.create_namespaced_secret(LOCAL_CLUSTERS_NAMESPACE, k.V1Secret(
                metadata=k.V1ObjectMeta(name=f"cluster-{i}", labels={"kube-syncer.io/kubeconfig": "true"}),
                data={"kubeconfig": base64.b64encode(cp.kubeconfig.read_bytes()).decode()}))


def _install_shipped_crds(management: Any) -> None:
    """The CRDs the project ships (deploy/crds: the cached resources'), on a fresh local plane."""
    import kubernetes

    from ..builtin.cached_resources.root import CRDS

    with kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            str(management.kubeconfig), context="admin") as api:
        for path in sorted(CRDS.glob("*.json")):
            kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(json.loads(path.read_text()))


def use_local_planes(settings: Settings, planes: Sequence[Any]) -> Settings:
    """The settings for running against local planes: the first is the management plane, the others become
    members. Prints how to reach each plane."""
    cp, workloads = planes[0], planes[1:]
    _install_shipped_crds(cp)
    settings = replace(settings, kubeconfig=str(cp.kubeconfig), context="admin", in_cluster=False)
    example = "apply -f examples/crds/widget.json" if _WIDGET_EXAMPLE in settings.plugins else "api-resources"
    # With members, the plugins' controllers run in them (not here, unless include_local): the hint goes there.
    print(f"local control plane at {cp.url}; kubeconfig: {cp.kubeconfig}" +
          ("" if workloads else f"\n  try: {cp.assets.kubectl} --kubeconfig {cp.kubeconfig} {example}"), flush=True)
    if not workloads:
        return settings
    _register_members(cp, workloads)
    for i, w in enumerate(workloads, 1):
        print(f"workload control plane {w.name} at {w.url}; kubeconfig: {w.kubeconfig}; member cluster-{i} "
              f"(Secret {LOCAL_CLUSTERS_NAMESPACE}/cluster-{i})\n"
              f"  try: {w.assets.kubectl} --kubeconfig {w.kubeconfig} {example}", flush=True)
    clusters = settings.clusters
    # The Secrets made here carry our label: a [clusters] section selecting others must still see them.
    selectors = clusters.label_selectors if MEMBER_LABEL in clusters.label_selectors else \
        (*clusters.label_selectors, MEMBER_LABEL)
    return replace(settings, clusters=replace(clusters, enabled=True, namespaces=(LOCAL_CLUSTERS_NAMESPACE,),
                                              label_selectors=selectors))
