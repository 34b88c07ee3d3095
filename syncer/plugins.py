"""Controller plugins: modules that contribute named ManagedControllers, and webhooks, stores and runnables.

A plugin is a dotted module path, a ``.py`` file, or an entry point in group ``syncer.controllers``, defining any of
the hooks ``syncer_controllers`` (each member cluster), ``syncer_fleet_controllers`` (once, over all clusters),
``syncer_fleet_components``, ``syncer_webhooks``, ``syncer_conversions``, ``syncer_stores`` and
``syncer_runnables``, each called with the plugin's table ``[plugin_settings.<short name>]``. Installed
entry-point plugins are loaded unless the ``entry_point_plugins`` setting says otherwise.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence, TypeVar

from loguru import logger

from controllers import ManagedController
from controllers.fleet import FleetComponent, FleetController
from informers import GVR

from .runnables import Runnable, Store, check_runnable, check_store

if TYPE_CHECKING:  # the webhook package is imported when a plugin declares a webhook or a conversion
    from .webhook import Conversion, Webhook

T = TypeVar("T")
HOOK = "syncer_controllers"
FLEET_HOOK = "syncer_fleet_controllers"
ENTRY_POINT_GROUP = "syncer.controllers"


class _Extension(NamedTuple):
    """An optional hook next to HOOK: it returns a list of ``noun``s, given as ``Plugins.<attribute>``; ``check``
    says what is wrong with an item ("" if nothing), ``key`` is what must be unique across plugins."""

    attribute: str
    noun: str
    check: Callable[[Any], str]
    key: Callable[[Any], str]


def _check_webhook(item: Any) -> str:
    from .webhook import Webhook

    return "" if isinstance(item, Webhook) else f"{type(item).__name__} is not a ValidatingWebhook or MutatingWebhook"


def _check_conversion(item: Any) -> str:
    from .webhook import Conversion

    return "" if isinstance(item, Conversion) else f"{type(item).__name__} is not a Conversion"


EXTENSION_HOOKS = {
    "syncer_webhooks": _Extension("webhooks", "webhook", _check_webhook, lambda w: w.path),
    "syncer_conversions": _Extension("conversions", "conversion", _check_conversion, lambda c: c.crd),
    "syncer_stores": _Extension("stores", "store", check_store, lambda s: s.name),
    "syncer_runnables": _Extension("runnables", "runnable", check_runnable, lambda r: r.name),
    "syncer_fleet_components": _Extension("components", "fleet component", lambda c: "" if isinstance(
        c, FleetComponent) else f"{type(c).__name__} has no name and async run(scope)", lambda c: c.name),
}


@dataclass(frozen=True)
class Plugins:
    """What the loaded plugins contribute: their controllers by name (run in every cluster), fleet controllers by
    name and fleet components (multi-cluster mode), admission webhooks, CRD conversions, stores and runnables."""

    controllers: dict[str, ManagedController] = field(default_factory=dict)
    fleet: dict[str, FleetController] = field(default_factory=dict)
    components: Sequence[FleetComponent] = ()
    webhooks: Sequence[Webhook] = ()
    conversions: Sequence[Conversion] = ()
    stores: Sequence[Store] = ()
    runnables: Sequence[Runnable] = ()

    @classmethod
    def of(cls, given: "Plugins | Mapping[str, ManagedController]") -> "Plugins":
        """``given`` itself, or a plain dict of controllers as the only contribution."""
        return given if isinstance(given, Plugins) else cls(dict(given))


class PluginError(Exception):
    """A plugin that cannot be used; the message names it and says what is wrong."""


def _import(spec: str) -> tuple[str, ModuleType]:
    if spec.endswith(".py") or "/" in spec:
        path = Path(spec)
        if not path.is_file():
            raise PluginError(f"plugin {spec!r}: file not found (looked for {path.resolve()}; relative paths are "
                              "taken from the current directory)")
        name = f"syncer_plugin_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise PluginError(f"plugin {spec!r}: cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
        return path.stem, module
    return spec.rsplit(".", 1)[-1], importlib.import_module(spec)


def _describe_import_error(spec: str, e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return f"plugin {spec!r} has a syntax error at {e.filename}:{e.lineno}: {e.msg}"
    if isinstance(e, ModuleNotFoundError) and e.name and spec.startswith(e.name):
        return f"plugin {spec!r} not found: no module named {e.name!r} (is it on PYTHONPATH or installed?)"
    return f"plugin {spec!r} raised on import: {type(e).__name__}: {e}{_where(e)}"


def _where(e: BaseException) -> str:
    """`` (file:line)`` of the innermost frame that raised ``e``, where the mistake most likely is."""
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    return f" ({frame.filename}:{frame.lineno})" if frame else ""


def _call(origin: str, hook_name: str, hook: Callable[..., Any], settings: dict[str, Any]) -> Any:
    """What ``hook(settings)`` returns; PluginError naming the plugin, the hook, the error and where it was raised."""
    try:
        return hook(settings)
    except Exception as e:
        raise PluginError(f"plugin {origin!r}: {hook_name}() raised {type(e).__name__}: {e}{_where(e)}") from None


def _named(origin: str, hook_name: str, hook: Callable[..., Any], settings: dict[str, Any], kind: type[T],
           expected: str) -> dict[str, T]:
    """The ``name -> kind`` dict a hook returns; PluginError naming the plugin, the hook and the bad entry."""
    result = _call(origin, hook_name, hook, settings)
    if not isinstance(result, Mapping):
        raise PluginError(f"plugin {origin!r}: {hook_name}() returned {type(result).__name__}, expected a dict of "
                          f"name -> {kind.__name__}")
    for name, value in result.items():
        if not isinstance(name, str) or not isinstance(value, kind):
            raise PluginError(f"plugin {origin!r}: {hook_name}() entry {name!r} is {type(value).__name__}, "
                              f"expected {expected}")
    return dict(result)


def _controllers(origin: str, hook: Callable[..., Any], settings: dict[str, Any]) -> dict[str, ManagedController]:
    found = _named(origin, HOOK, hook, settings, ManagedController, "a ManagedController")
    for name, value in found.items():
        _check_controller(origin, name, value)
    return found


def _fleet(origin: str, hook: Callable[..., Any], settings: dict[str, Any]) -> dict[str, FleetController]:
    found = _named(origin, FLEET_HOOK, hook, settings, FleetController,
                   "a FleetController (from controllers.fleet import FleetController)")
    for name, value in found.items():
        if not isinstance(value.gvr, GVR):
            raise PluginError(f"plugin {origin!r}: fleet controller {name!r}: gvr {value.gvr!r} is a "
                              f"{type(value.gvr).__name__}, not a GVR (from informers import GVR)")
        if not callable(value.create):
            raise PluginError(f"plugin {origin!r}: fleet controller {name!r}: create is not a function")
    return found


def _check_controller(origin: str, name: str, controller: ManagedController) -> None:
    """Reject what the manager would only trip over later: a controller waiting for something that is no GVR
    never starts, and nothing would say why."""
    where = f"plugin {origin!r}: controller {name!r}"
    gvrs = controller.required_gvrs
    if isinstance(gvrs, (str, bytes)) or not isinstance(gvrs, Iterable):
        raise PluginError(f"{where}: required GVRs must be a list of GVR, got {gvrs!r}")
    for entry in gvrs:
        if not isinstance(entry, GVR):
            fix = f"GVR.parse({entry!r})" if isinstance(entry, str) else "GVR(group, version, resource)"
            raise PluginError(f"{where}: required GVR {entry!r} is a {type(entry).__name__}, not a GVR; "
                              f"use {fix} (from informers import GVR)")
    if not callable(controller.create):
        raise PluginError(f"{where}: create is a {type(controller.create).__name__}, expected a function "
                          "create(ctx) returning the controller's start function")


def _extensions(origin: str, hook_name: str, hook: Callable[..., Any], settings: dict[str, Any]) -> list[Any]:
    extension = EXTENSION_HOOKS[hook_name]
    result = _call(origin, hook_name, hook, settings)
    if not isinstance(result, (list, tuple)):
        raise PluginError(f"plugin {origin!r}: {hook_name}() returned {type(result).__name__}, expected a list of "
                          f"{extension.attribute}")
    for item in result:
        problem = extension.check(item)
        if problem:
            raise PluginError(f"plugin {origin!r}: {hook_name}() returned an item that is no use: {problem}")
    return list(result)


def _hooks(target: Any) -> dict[str, Callable[..., Any]]:
    """The hooks a plugin module defines, by name."""
    return {name: hook for name in (HOOK, FLEET_HOOK, *EXTENSION_HOOKS)
            if callable(hook := getattr(target, name, None))}


def _entry_point_hooks(allowed: bool | Collection[str], loaded: Mapping[str, str]
                       ) -> list[tuple[str, str, dict[str, Callable[..., Any]]]]:
    """(origin, name, hooks by name) of the installed entry-point plugins that ``allowed`` lets in (True: all),
    except modules already ``loaded`` (source file -> spec)."""
    if allowed is False:
        return []
    import importlib.metadata  # ~0.8 MiB with email, zipfile and csv: not for processes that load no plugins

    installed = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    if allowed is not True:
        missing = sorted(set(allowed) - set(installed.names))
        if missing:
            raise PluginError(f"setting 'entry_point_plugins' names {', '.join(map(repr, missing))}, which no "
                              f"installed package advertises in entry point group {ENTRY_POINT_GROUP!r} "
                              f"(installed: {', '.join(sorted(installed.names)) or 'none'}); fix the setting")
    hooks = []
    for ep in installed:
        if allowed is not True and ep.name not in allowed:
            continue
        origin = f"entry point {ep.name} = {ep.value}"
        try:
            target = ep.load()
        except BaseException as e:
            raise PluginError(_describe_import_error(origin, e)) from None
        if _module_file(target) in loaded:
            logger.debug("plugin {!r} is {!r} again: loaded once", origin, loaded[_module_file(target) or ""])
            continue
        found = _hooks(target) if isinstance(target, ModuleType) else {HOOK: target} if callable(target) else {}
        if not found:
            raise PluginError(f"plugin {origin!r} is neither a module with {HOOK}() nor a callable")
        hooks.append((origin, ep.name, found))
    return hooks


def _origin(spec: str) -> str | None:
    """The source file a plugin spec names (a file's real path, a dotted module's origin), found without running
    the plugin; None when it cannot be told (the import then says why)."""
    try:
        if spec.endswith(".py") or "/" in spec:
            return os.path.realpath(spec)
        found = importlib.util.find_spec(spec)
    except Exception:  # a parent package that fails to import, say: the import reports it
        return None
    return os.path.realpath(found.origin) if found is not None and found.origin else None


def _module_file(target: Any) -> str | None:
    path = getattr(target, "__file__", None) if isinstance(target, ModuleType) else None
    return os.path.realpath(path) if path else None


def load_plugins(specs: Sequence[str], plugin_settings: Mapping[str, dict[str, Any]] | None = None,
                 entry_points: bool | Collection[str] = True) -> Plugins:
    """Import every plugin and collect their controllers, webhooks, stores and runnables; PluginError on the first
    problem (a name defined twice included).

    ``entry_points``: load the installed entry-point plugins too (True), none of them (False), or only those
    named. A ``plugin_settings`` table that matches no loaded plugin is logged as a warning: it is a typo or a
    plugin that is not loaded.
    """
    settings = plugin_settings or {}
    hooks: list[tuple[str, str, dict[str, Callable[..., Any]]]] = []  # (origin, short name, hooks by name)
    # A module listed again (the same spec, its file and its dotted path, an entry point of a listed one) is one
    # plugin, and is not run twice: its module-level state (a metric, a registry) would clash with itself.
    loaded: dict[str, str] = {}  # source file -> the spec that loaded it
    for spec in specs:
        origin = _origin(spec)
        if origin is not None and origin in loaded:
            logger.debug("plugin {!r} is {!r} again: loaded once", spec, loaded[origin])
            continue
        try:
            short, module = _import(spec)
        except PluginError:
            raise
        except BaseException as e:  # a plugin may raise anything on import, SystemExit included
            raise PluginError(_describe_import_error(spec, e)) from None
        found = _hooks(module)
        if not found:
            raise PluginError(f"plugin {spec!r} has no function {HOOK}(settings) returning its controllers")
        loaded[_module_file(module) or origin or spec] = spec
        hooks.append((spec, short, found))
    hooks += _entry_point_hooks(entry_points, loaded)
    names = sorted({short for _, short, _ in hooks})
    for table in sorted(set(settings) - set(names)):
        logger.warning("[plugin_settings.{}] matches no loaded plugin and is ignored; loaded plugins: {}",
                       table, ", ".join(names) or "none")
    controllers: dict[str, ManagedController] = {}
    fleet: dict[str, FleetController] = {}
    extensions: dict[str, list[Any]] = {e.attribute: [] for e in EXTENSION_HOOKS.values()}
    owner: dict[tuple[str, str], str] = {}  # (what, name) -> origin

    def claim(what: str, name: str, origin: str) -> None:
        if (what, name) in owner:
            raise PluginError(f"{what} name {name!r} is defined by both plugin {owner[what, name]!r} and "
                              f"plugin {origin!r}; rename one")
        owner[what, name] = origin

    for origin, short, found in hooks:
        own = settings.get(short, {})
        if HOOK in found:
            for name, controller in _controllers(origin, found[HOOK], dict(own)).items():
                claim("controller", name, origin)
                controllers[name] = controller
        if FLEET_HOOK in found:
            for name, fleet_controller in _fleet(origin, found[FLEET_HOOK], dict(own)).items():
                claim("controller", name, origin)
                fleet[name] = fleet_controller
        for hook_name, extension in EXTENSION_HOOKS.items():
            if hook_name in found:
                items = _extensions(origin, hook_name, found[hook_name], dict(own))
                for item in items:
                    claim(extension.noun, extension.key(item), origin)
                extensions[extension.attribute] += items
    return Plugins(controllers, fleet, **{attribute: tuple(items) for attribute, items in extensions.items()})
