"""A leadership term is a fence: a paused or partitioned leader never acts next to its successor (real apiserver)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path

import kubernetes
import pytest

from controllers import ControllerContext
from informers import GVR, ApiClient, FenceError
from syncer.leader import LeaderElector
from syncer.settings import LeaderElection
from syncer.testing.pytest_plugin import kube_client
from tests.fenced_writes import Writes
from tests.proxy import Proxy

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
CONFIGMAPS = GVR("", "v1", "configmaps")
# renew_deadline is the term; lease_duration - renew_deadline the margin in which the old term must stop.
LEASE = ('[leader_election]\nenabled = true\nlease_namespace = "default"\nlease_duration = "6s"\n'
         'renew_deadline = "4s"\nretry_period = "0.5s"\n')


@contextlib.asynccontextmanager
async def elector_via_proxy(cp, config: LeaderElection, identity: str):
    """A LeaderElector talking to ``cp`` through a fault-injection Proxy: ``(elector, proxy)``."""
    proxy = await Proxy(cp.port).start()
    conf = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(cp.kubeconfig), client_configuration=conf)
    conf.host = f"https://127.0.0.1:{proxy.port}"
    try:
        async with ApiClient.from_configuration(conf) as client:
            yield LeaderElector(client, config, identity=identity), proxy
    finally:
        await proxy.stop()


def test_resumed_leader_writes_nothing_after_the_standby_took_over(control_plane_factory, sidecars) -> None:
    cp = control_plane_factory()
    core = kubernetes.client.CoreV1Api(kube_client(cp))
    core.create_namespaced_config_map("default", {"metadata": {"name": "fenced", "labels": {"fence-test": "true"}}})
    plugin = (str(PLUGINS / "fence_writer.py"),)
    sc = {n: sidecars(str(cp.kubeconfig), n, LEASE + f'[plugin_settings.fence_writer]\nidentity = "{n}"\n',
                  plugins=plugin) for n in ("a", "b")}
    writes = Writes(cp, "fenced")
    try:
        sc["a"].wait(lambda: bool(writes.writers), "a leader writing")
        first = writes.writers[0]
        other = "b" if first == "a" else "a"
        leader, standby = sc[first], sc[other]
        leader.proc.send_signal(signal.SIGSTOP)
        # the standby takes the lease once it has not seen it renewed for lease_duration, then writes
        standby.wait(lambda: other in writes.writers, "the standby taking over and writing", timeout=20)
        time.sleep(1.0)  # the paused leader stays paused well past its term, with work queued and timers due
        leader.proc.send_signal(signal.SIGCONT)
        leader.wait(lambda: "lost leadership" in leader.log, "the resumed replica noticing", timeout=10)
        leader.wait(lambda: leader.status().get("leader") is False, "the resumed replica standing by", timeout=10)
        # give any write it would still send time to show up
        standby.wait(lambda: len(writes.after_first(other)) > 30, "more writes by the new leader", timeout=20)
        after = writes.after_first(other)
        # Under heavy load the new leader can miss its own deadline and the old one win the lease back: then
        # its writes are legitimate, and this run cannot judge the fence.
        assert leader.log.count("became leader") == 1, "leadership moved back:\n" + leader.log[-3000:]
        assert first not in after, f"the resumed old leader wrote after its successor: {after}\n{leader.log[-3000:]}"
        assert leader.proc.poll() is None, leader.log[-3000:]
        lease = kubernetes.client.CoordinationV1Api(kube_client(cp)).read_namespaced_lease("kube-syncer", "default")
        assert lease.spec.holder_identity == other and lease.spec.lease_transitions >= 1
    finally:
        writes.stop()


def test_a_controller_stuck_at_lease_loss_makes_the_process_exit(control_plane_factory, sidecars) -> None:
    cp = control_plane_factory()
    car = sidecars(str(cp.kubeconfig), "a", LEASE, plugins=(str(PLUGINS / "stuck_controller.py"),))
    car.wait(lambda: car.controller_state("stubborn") == "running", "the stubborn controller running")
    leases = kubernetes.client.CoordinationV1Api(kube_client(cp))
    lease = leases.read_namespaced_lease("kube-syncer", "default")
    lease.spec.holder_identity = "intruder"
    lease.spec.lease_duration_seconds = 60
    leases.replace_namespaced_lease("kube-syncer", "default", lease)
    assert car.proc.wait(20) == 1
    lines = [ln for ln in car.log.splitlines() if "no two leaders" in ln]
    assert lines and "stubborn" in lines[0] and lines[-1].startswith("error: "), car.log[-3000:]
    assert "Traceback" not in car.log
    # the lease was not released: the intruder's record is untouched
    assert leases.read_namespaced_lease("kube-syncer", "default").spec.holder_identity == "intruder"


async def test_an_unreachable_apiserver_ends_the_term_at_the_renew_deadline(control_plane) -> None:
    config = LeaderElection(enabled=True, lease_name="partition-test", lease_namespace="default",
                            lease_duration=4, renew_deadline=2, retry_period=0.3)
    async with elector_via_proxy(control_plane, config, "partitioned") as (elector, proxy):
        await asyncio.wait_for(elector.acquire(), 10)
        fence = elector.fence()
        holding = asyncio.create_task(elector.hold())
        await asyncio.sleep(0.8)  # a couple of successful renewals
        assert fence.valid() and not holding.done()
        # new connections are refused and current ones freeze: requests hang rather than fail
        proxy.refuse = True
        proxy.freeze()
        last = elector.renewal.last_renew
        await asyncio.wait_for(holding, 5)
        ended = time.monotonic()
        assert not fence.valid() and not elector.is_leader
        # ends at the deadline counted from the last success, not a fresh deadline per attempt
        assert ended - last < config.renew_deadline + 0.5, ended - last
        assert ended - last >= config.renew_deadline - 0.05
        # a fenced client refuses writes without sending anything
        ctx = ControllerContext("c", {}, _NoSource(), elector.client, fence=fence)
        with pytest.raises(FenceError):
            await ctx.client.request("POST", CONFIGMAPS.path("default"), body={})


async def test_the_leader_keeps_renewing_while_connections_are_cut(control_plane) -> None:
    config = LeaderElection(enabled=True, lease_name="cut-test", lease_namespace="default",
                            lease_duration=4, renew_deadline=2, retry_period=0.2)
    async with elector_via_proxy(control_plane, config, "cut") as (elector, proxy):
        await asyncio.wait_for(elector.acquire(), 10)
        fence = elector.fence()
        holding = asyncio.create_task(elector.hold())
        renewed = elector.renewal.last_renew
        for _ in range(10):  # cut every connection, mid-request or idle, for three renew deadlines
            await asyncio.sleep(0.6)
            proxy.cut()
            assert fence.valid() and not holding.done()
        assert elector.renewal.last_renew > renewed
        holding.cancel()
        await asyncio.gather(holding, return_exceptions=True)
        assert fence.valid()


class _NoSource:
    def informers(self):
        return {}, []

    def require(self, owner, gvrs):
        pass

    def release(self, owner):
        pass

    def add_removal_hook(self, hook):
        return lambda: None

    def explain(self, gvr):
        return None

    def subscribe(self, id):
        raise NotImplementedError

    def unsubscribe(self, id):
        pass


async def test_a_fence_closing_while_the_request_is_prepared_stops_the_send(monkeypatch) -> None:
    conf = kubernetes.client.Configuration()
    conf.host = "https://127.0.0.1:1"  # nothing listens: a request that got through would fail to connect
    open_ = [True]
    async with ApiClient.from_configuration(conf) as client:
        fenced = client.fenced(lambda: open_[0])

        async def slow_credentials() -> dict[str, str]:
            open_[0] = False  # the term ends while, say, an exec credential plugin runs
            return {}

        monkeypatch.setattr(client, "_headers", slow_credentials)
        with pytest.raises(FenceError, match="POST /api/v1/namespaces/default/configmaps refused"):
            await fenced.request("POST", CONFIGMAPS.path("default"), body={})
        assert fenced.recoveries == client.recoveries


async def test_a_fenced_view_of_a_fenced_client_keeps_both_fences() -> None:
    conf = kubernetes.client.Configuration()
    conf.host = "https://127.0.0.1:1"
    inner_open = [True]
    async with ApiClient.from_configuration(conf) as client:
        view = client.fenced(lambda: inner_open[0]).fenced(lambda: True, remaining=lambda: 5.0)
        inner_open[0] = False
        with pytest.raises(FenceError):
            await view.request("DELETE", CONFIGMAPS.path("default", "x"))
