"""Settings: a TOML file plus ``SYNCER_*`` environment variables, validated at load time into frozen dataclasses.

``tables.py`` holds the typed tables (``Settings`` and its ``[table]`` dataclasses), ``checks.py`` the value
checks, ``schema.py`` which setting gets which check, and ``loader.py`` the reading (file, environment, command-line
overrides), the rejection of unknown settings, where a setting came from, and ``settings_reference()``.
"""

from .checks import parse_duration
from .loader import (
    ENV_PREFIX, SETTINGS_ENV, SettingsError, env_var, load_settings, origin_of, settings_reference,
)
from .tables import (
    CLUSTER_PROVIDERS, LOG_LEVELS, MAX_WORKERS, ClusterAPI, ClusterProfile, Clusters, HostNamespaces, KubeconfigFiles,
    LeaderElection, Settings, Sharding, Tracing, UnitKind, Webhooks,
)

__all__ = ["CLUSTER_PROVIDERS", "ENV_PREFIX", "LOG_LEVELS", "MAX_WORKERS", "SETTINGS_ENV", "ClusterAPI",
           "ClusterProfile", "Clusters", "HostNamespaces", "KubeconfigFiles", "LeaderElection", "Settings",
           "SettingsError", "Sharding", "Tracing", "UnitKind", "Webhooks", "env_var", "load_settings", "origin_of", "parse_duration", "settings_reference"]
