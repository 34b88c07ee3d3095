"""What a process imports is what its mode needs (start-up RSS, bench/import_bench.py): checked in a fresh interpreter
through ``sys.modules``, never by timing or RSS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Loaded only by the modes that use them: the kubernetes package (kubeconfigs only it can load), cryptography
# (a kubeconfig Secret's client certificate, the webhook server's certificates), dynaconf (settings that use its own
# features), importlib.metadata (installed entry-point plugins), tenacity (the sidecar's connect retries) and the
# sidecar's optional parts (the webhook package: plugins that declare webhooks).
LAZY = ["kubernetes", "cryptography", "dynaconf", "importlib.metadata", "tenacity", "aiohttp.web", "syncer.webhook",
        "syncer.webhook.service",
        "syncer.webhook.server", "syncer.webhook.certificates", "syncer.sharding.coordinator", "syncer.sharding.units",
        "syncer.sharding.group", "syncer.sharding.state", "syncer.fences", "syncer.workloads.sharded",
        "syncer.workloads.fleet", "syncer.leader", "syncer.debug", "syncer.builtin", "syncer.status_page",
        "opentelemetry", "controllers.otel_tracing"]


def _imported(code: str, tmp_path: Path) -> list[str]:
    """The LAZY modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {LAZY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout.splitlines()[-1]))


def _kubeconfig(tmp_path: Path, user: dict[str, object]) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "current-context": "c", "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}], "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return path


def test_the_fleet_process_imports_none_of_the_optional_parts(tmp_path: Path) -> None:
    """informers, controllers and the runtime module; clients from a kubeconfig (token, exec), a kubeconfig Secret
    and a ClientConfig; the settings' defaults: nothing listed in LAZY."""
    path = _kubeconfig(tmp_path, {"token": "t"})
    (tmp_path / "exec").mkdir()
    exec_path = _kubeconfig(tmp_path / "exec", {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                         "command": "get-token"}})
    code = f"""
import informers, controllers, syncer.runtime, syncer.cli
from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry
from controllers.providers.secrets import SecretProvider
from informers import ApiClient, client_from_untrusted_kubeconfig
from informers.kubeconfig import ClientConfig
from syncer.settings import Settings
ApiClient.from_kubeconfig({str(path)!r})
ApiClient.from_kubeconfig({str(exec_path)!r})
ApiClient(ClientConfig("https://127.0.0.1:6443"))
client_from_untrusted_kubeconfig(open({str(path)!r}).read())
api = ApiClient.from_kubeconfig({str(path)!r})
ClusterRegistry(api, [SecretProvider(api)], make_factory=lambda c, n: None)
ClusterControllers({{}}, name="x")
Settings()
"""
    assert _imported(code, tmp_path) == []


def test_syncer_with_defaults_imports_none_of_them(tmp_path: Path) -> None:
    """A Syncer with default settings (election off, no webhooks, no sharding, no debug endpoints): its HTTP
    endpoints are served without aiohttp's server."""
    code = """
from informers import ApiClient
from informers.kubeconfig import ClientConfig
from syncer.runtime import Syncer
from syncer.settings import Settings
Syncer(Settings(), ApiClient(ClientConfig("https://127.0.0.1:6443")), {})
"""
    assert _imported(code, tmp_path) == []


def test_a_mode_imports_its_own_workload_only(tmp_path: Path) -> None:
    """Multi-cluster mode loads the fleet workload, and no sharding."""
    code = """
from dataclasses import replace
from informers import ApiClient
from informers.kubeconfig import ClientConfig
from syncer.runtime import Syncer
from syncer.settings import Settings
s = Settings()
Syncer(replace(s, clusters=replace(s.clusters, enabled=True)), ApiClient(ClientConfig("https://127.0.0.1:6443")), {})
"""
    assert _imported(code, tmp_path) == ["syncer.workloads.fleet"]


def test_what_only_the_package_loads_imports_it(tmp_path: Path) -> None:
    """An auth-provider still goes to the kubernetes package's loader."""
    path = _kubeconfig(tmp_path, {"auth-provider": {"name": "custom"}, "token": "t"})
    assert "kubernetes" in _imported(f"from informers import ApiClient\nApiClient.from_kubeconfig({str(path)!r})",
                                     tmp_path)


def test_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    """With the default ``[tracing]`` (off), the sidecar's tracing owner installs nothing and a reconcile runs
    through the null span: no module of OpenTelemetry is loaded (installed or not)."""
    code = """
import asyncio
from controllers.keyed_loop import KeyedLoop
from controllers.reconcile import Request
from controllers.tracing import current_tracing
from controllers.workqueue import WorkQueue
import syncer.cli.run
from syncer.settings import Settings
from syncer.tracing import traced

async def main():
    async with traced(Settings().tracing):
        done = asyncio.Event()
        async def handle(req):
            done.set()
        queue = WorkQueue("q")
        tracing = current_tracing()
        loop = KeyedLoop("q", queue, handle, span=lambda req: tracing.reconcile("q", None, None, req))
        queue.add(Request("a", "ns"))
        task = asyncio.create_task(loop.run())
        await done.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

asyncio.run(main())
"""
    assert _imported(code, tmp_path) == []


def test_syncer_runs_start_up_loads_only_what_its_settings_use(tmp_path: Path) -> None:
    """Plain settings (a file and SYNCER_* variables) are read without dynaconf, the event loop is named without
    importlib.metadata, and plugins without webhooks (entry points off) load no webhook package."""
    (tmp_path / "settings.toml").write_text('workers = 3\nentry_point_plugins = false\n[leader_election]\n'
                                            'lease_name = "x"\n')
    (tmp_path / "plain_plugin.py").write_text("def syncer_controllers(settings):\n    return {}\n")
    code = f"""
import os, sys
sys.path.insert(0, {str(tmp_path)!r})
os.environ.update(SYNCER_LOG_LEVEL="DEBUG", SYNCER_LEADER_ELECTION__ENABLED="true", SYNCER_INCLUDE='["core/pods"]')
from syncer.cli.run import event_loop
from syncer.plugins import load_plugins
from syncer.settings import load_settings
s = load_settings({str(tmp_path / "settings.toml")!r})
assert (s.workers, s.log_level, s.leader_election.enabled, s.include) == (3, "DEBUG", True, ("core/pods",))
assert event_loop(s)[1].startswith("uvloop ")
load_plugins(["plain_plugin"], s.plugin_settings, s.entry_point_plugins)
"""
    assert _imported(code, tmp_path) == []


def test_what_only_dynaconf_reads_imports_it(tmp_path: Path) -> None:
    """A value with one of dynaconf's own markers is read by dynaconf."""
    code = """
import os
os.environ["SYNCER_WORKERS"] = "@int 4"
from syncer.settings import load_settings
assert load_settings().workers == 4
"""
    assert "dynaconf" in _imported(code, tmp_path)
