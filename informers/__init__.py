"""Asyncio shared index informers for any Kubernetes resource, with client-go semantics."""

from .backoff import Backoff
from .client import ApiClient
from .credentials import CredentialError, ExecPlugin, ExecPluginError, ExecPluginTimeout
from .discovering_factory import DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, GVRState, GVRStatus
from .discovery import DiscoveryClient, DiscoveryForbidden, DiscoveryResult, ResourceInfo
from .errors import (
    AlreadyExists, ApiError, Conflict, FenceError, Forbidden, Gone, Invalid, NotFound, TooManyRequests, Unauthorized,
    UnsupportedMediaType,
)
from .factory import DynamicSharedInformerFactory
from .field_selector import FieldSelector
from .frozen import FrozenDict, FrozenList, ReadOnlyError, deep_copy
from .gvr import GVR, MetadataGVR
from .gvr_listeners import GVRHandler
from .kubeconfig import ClientConfig
from .object_shard import ObjectShard
from .lister import Lister
from .mapper import NoMatchError, RESTMapper
from .metrics import InformerMetrics
from .reflector import Reflector, ReflectorOptions
from .resource import ResourceClient
from .resource_filter import ResourceFilter, Rule
from .selector import LabelSelector, SelectorError
from .shared_informer import EventHandler, FuncHandler, HandlerRegistration, SharedIndexInformer
from .source import (
    ClusterSource, DemandSource, Explains, InformerSource, Notifier, RemovalHook, RemovalHooks, Subscription,
)
from .supervisor import Supervisor, TaskHandle, TaskHealth, TaskState
from .store import DeletedFinalStateUnknown, Store, object_key
from .transforms import drop_managed_fields
from .union_informer import (
    ClusterEventHandler, HandlerInstallError, SubInformer, UnionInformer, UnionRegistration,
)
from .union_lister import ClusterNotFound, ClusterObject, UnionLister
from .untrusted_kubeconfig import (
    KubeconfigError, KubeconfigInvalid, KubeconfigRefused, client_from_untrusted_kubeconfig, kubeconfig_hash,
)
from .version import __version__
from .wait import wait_first

__all__ = [
    "__version__",
    "ApiClient", "ApiError", "Backoff", "ClientConfig", "DeletedFinalStateUnknown", "DiscoveringDynamicSharedInformerFactory",
    "CredentialError", "ExecPlugin", "ExecPluginError", "ExecPluginTimeout", "FieldSelector",
    "DiscoveryClient", "DiscoveryOptions", "DiscoveryForbidden", "DiscoveryResult", "DynamicSharedInformerFactory", "EventHandler",
    "FenceError", "FuncHandler", "GVR", "GVRHandler", "GVRState", "GVRStatus", "HandlerRegistration", "InformerMetrics",
    "InformerSource", "ClusterSource", "DemandSource", "Explains", "RemovalHooks", "LabelSelector", "Lister", "Notifier", "Reflector", "ReflectorOptions", "RemovalHook",
    "ObjectShard", "ResourceFilter", "ResourceInfo", "Rule", "SelectorError", "SharedIndexInformer", "Store", "Subscription",
    "Supervisor", "TaskHandle", "TaskHealth", "TaskState", "drop_managed_fields", "object_key", "wait_first",
    "AlreadyExists", "Conflict", "Forbidden", "Gone", "Invalid", "NoMatchError", "NotFound", "RESTMapper",
    "ResourceClient", "TooManyRequests", "Unauthorized", "UnsupportedMediaType",
    "FrozenDict", "FrozenList", "ReadOnlyError", "deep_copy", "MetadataGVR",
    "ClusterEventHandler", "ClusterNotFound", "ClusterObject", "HandlerInstallError", "SubInformer", "UnionInformer",
    "UnionLister", "UnionRegistration",
    "KubeconfigError", "KubeconfigInvalid", "KubeconfigRefused", "client_from_untrusted_kubeconfig", "kubeconfig_hash",
]
