"""Built-in plugins of the sidecar: they live here and are loaded like any other plugin, by dotted path in the
``plugins`` setting (e.g. ``syncer.builtin.cached_resources``); nothing is loaded unless the settings name it."""
