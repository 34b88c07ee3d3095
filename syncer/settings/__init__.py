"""Settings: a TOML file plus ``SYNCER_*`` environment variables, validated at load time into frozen dataclasses.

``tables.py`` holds the typed tables (``Settings`` and its ``[table]`` dataclasses), ``checks.py`` the value
checks, ``providers.py`` the kinds of cluster provider (their tables, checks and builders), ``schema.py`` which
setting gets which check, ``reader.py`` the raw reading of the file and the environment (as dynaconf reads them,
dynaconf itself only for its own features), and ``loader.py`` the loading (file, environment, command-line
overrides), the rejection of unknown settings, where a setting came from, and ``settings_reference()``.
"""

from .checks import parse_duration
from .loader import (
    ENV_PREFIX, SETTINGS_ENV, SettingsError, env_var, load_settings, origin_of, settings_reference,
)
from .providers import CLUSTER_PROVIDERS, PROVIDER_KINDS, ProviderKind
from .tables import LOG_LEVELS, MAX_WORKERS, Clusters, LeaderElection, Settings, Sharding, Tracing, UnitKind, Webhooks

__all__ = ["CLUSTER_PROVIDERS", "ENV_PREFIX", "LOG_LEVELS", "MAX_WORKERS", "PROVIDER_KINDS", "SETTINGS_ENV",
           "Clusters", "LeaderElection", "ProviderKind", "Settings", "SettingsError", "Sharding", "Tracing", "UnitKind", "Webhooks", "env_var", "load_settings", "origin_of", "parse_duration", "settings_reference"]
