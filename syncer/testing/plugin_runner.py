"""run_plugin: a plugin's controllers, and its webhooks, against a ControlPlane in the test's own event loop.

``async with run_plugin(control_plane, "backup.py", settings) as running:`` runs the same ``Syncer`` as ``syncer
run``, without signal handlers, logging setup or a loop of its own; the block's end stops it as SIGTERM would and
raises what made it fail. ``settings`` are a settings file as a dict; defaults differ so tests can share a control
plane: free loopback ports, an own ``webhooks.configuration_name``, ``entry_point_plugins = false`` and
``watch = "required"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from typing import Any, AsyncIterator, Mapping, Sequence

from informers import ApiClient

from ..plugins import Plugins, load_plugins
from ..runtime import Syncer
from ..settings import Settings, load_settings
from ..settings.loader import flatten
from .controlplane import ControlPlane
from .processes import free_port
from .wait import eventually

_FIXED = ("kubeconfig", "context", "in_cluster", "plugins")
_ORIGIN = "run_plugin's settings"

PluginSpec = str | os.PathLike[str]


class RunningPlugin:
    """The sidecar ``run_plugin`` runs: wait for its controllers, read its ``/status`` document."""

    def __init__(self, syncer: Syncer, task: asyncio.Task[None]) -> None:
        self.syncer = syncer
        self._task = task

    @property
    def settings(self) -> Settings:
        """The settings it runs with, defaults included."""
        return self.syncer.settings

    @property
    def plugins(self) -> Plugins:
        """What the plugins contributed: controllers by name, webhooks, stores, runnables."""
        return self.syncer.plugins

    def status(self) -> dict[str, Any]:
        """The ``/status`` document, as ``syncer status`` reads it: controllers, GVRs, webhooks, ..."""
        return self.syncer.status()

    def controller(self, name: str) -> dict[str, Any]:
        """The ``/status`` row of controller ``name``: ``state``, ``reconciles``, ``last_reconcile_error``, ..."""
        rows: dict[str, dict[str, Any]] = {row["name"]: row for row in self.status()["controllers"]}
        if name not in rows:
            raise KeyError(f"no controller {name!r}; the plugins define {', '.join(sorted(rows)) or 'none'}")
        return rows[name]

    async def wait_running(self, *controllers: str, timeout: float = 60) -> None:
        """Return once the sidecar is ready (discovery done and, with webhooks, the API server calling them) and
        ``controllers`` (default: all of them) are running. AssertionError after ``timeout`` seconds says what each
        still waits for; if the sidecar stopped, what stopped it is raised."""
        defined = self.syncer.plugins.controllers
        names = controllers or tuple(defined)
        unknown = sorted(set(names) - set(defined))
        if unknown:
            raise KeyError(f"no controller {', '.join(map(repr, unknown))}; the plugins define "
                           f"{', '.join(sorted(defined)) or 'none'}")

        def running() -> bool:
            self._raise_if_stopped()
            return self.syncer.not_ready() is None and all(self.controller(n)["state"] == "running" for n in names)

        try:
            await eventually(running, timeout)
        except AssertionError:
            raise AssertionError(f"timed out after {timeout:g}s waiting for the plugin to run: "
                                 f"{self._describe(names)}") from None

    def _raise_if_stopped(self) -> None:
        if self._task.done():
            error = None if self._task.cancelled() else self._task.exception()
            if error is not None:
                raise error
            raise RuntimeError("the sidecar stopped")

    def _describe(self, names: Sequence[str]) -> str:
        """What is not there yet: readiness, then each controller that is not running and why."""
        parts = [f"not ready ({why})"] if (why := self.syncer.not_ready()) else []
        for name in names:
            row = self.controller(name)
            if row["state"] == "running":
                continue
            waiting = [*row.get("missing", ()), *(f"{gvr} to sync" for gvr in row.get("not_synced", ()))]
            details = [f"waiting for {', '.join(waiting)}"] if waiting else []
            if row.get("last_error"):
                details.append(f"last error: {row['last_error']}")
            parts.append(f"controller {name} {row['state']}" + (f" ({'; '.join(details)})" if details else ""))
        return "; ".join(parts)


def runner_settings(control_plane: ControlPlane, plugins: Sequence[PluginSpec],
                    settings: Mapping[str, Any] | None = None) -> Settings:
    """The settings ``run_plugin`` runs ``plugins`` with against ``control_plane`` (see the module docstring);
    SettingsError names a bad setting, ValueError one that ``run_plugin`` sets itself."""
    given = dict(settings or {})
    fixed = sorted(set(given) & set(_FIXED))
    if fixed:
        raise ValueError(f"{_ORIGIN} cannot set {', '.join(fixed)}: the control plane gives the credentials and "
                         "the plugin argument the plugins")
    defaults = {"entry_point_plugins": False, "watch": "required", "http_bind": f"127.0.0.1:{free_port()}",
                "webhooks.bind": f"127.0.0.1:{free_port()}",
                "webhooks.configuration_name": f"kube-syncer-test-{uuid.uuid4().hex[:8]}"}
    return load_settings(None, {**defaults, **flatten(given), "kubeconfig": str(control_plane.kubeconfig),
                                "context": "admin", "plugins": [os.fspath(p) for p in plugins]}, _ORIGIN)


@contextlib.asynccontextmanager
async def run_plugin(control_plane: ControlPlane, plugin: PluginSpec | Sequence[PluginSpec],
                     settings: Mapping[str, Any] | None = None) -> AsyncIterator[RunningPlugin]:
    """Run ``plugin`` (a ``.py`` path or a dotted module path, or a list of them) against ``control_plane`` with
    ``settings`` (a settings file's content as a dict) for the duration of the block; see the module docstring.
    PluginError or SettingsError say what is wrong with the plugin or the settings."""
    specs = [plugin] if isinstance(plugin, (str, os.PathLike)) else list(plugin)
    s = runner_settings(control_plane, specs, settings)
    plugins = load_plugins(s.plugins, s.plugin_settings, s.entry_point_plugins)
    client = ApiClient.from_kubeconfig(s.kubeconfig, s.context)
    syncer = Syncer(s, client, plugins)
    stop = asyncio.Event()
    task = asyncio.create_task(syncer.run(stop), name=f"run_plugin {', '.join(s.plugins)}")
    try:
        yield RunningPlugin(syncer, task)
    finally:
        stop.set()
        try:
            await task
        finally:
            await client.close()  # the sidecar closes it when it gets that far; a failed start does not
