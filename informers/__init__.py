"""Asyncio shared index informers for any Kubernetes resource, with client-go semantics."""

from .backoff import Backoff
from .client import ApiClient
from .discovering_factory import DiscoveringDynamicSharedInformerFactory, GVRHandler, GVRStatus
from .discovery import DiscoveryClient, DiscoveryResult, ResourceInfo
from .errors import ApiError
from .factory import DynamicSharedInformerFactory
from .gvr import GVR
from .lister import Lister
from .metrics import InformerMetrics
from .reflector import Reflector, ReflectorOptions
from .resource_filter import ResourceFilter, Rule
from .selector import LabelSelector, SelectorError
from .shared_informer import EventHandler, FuncHandler, HandlerRegistration, SharedIndexInformer
from .source import InformerSource, Notifier, Subscription
from .store import DeletedFinalStateUnknown, Store, object_key
from .transforms import drop_managed_fields

__all__ = [
    "ApiClient", "ApiError", "Backoff", "DeletedFinalStateUnknown", "DiscoveringDynamicSharedInformerFactory",
    "DiscoveryClient", "DiscoveryResult", "DynamicSharedInformerFactory", "EventHandler", "FuncHandler", "GVR",
    "GVRHandler", "GVRStatus", "HandlerRegistration", "InformerMetrics", "InformerSource", "LabelSelector", "Lister",
    "Notifier", "Reflector", "ReflectorOptions", "ResourceFilter", "ResourceInfo", "Rule", "SelectorError",
    "SharedIndexInformer", "Store", "Subscription", "drop_managed_fields", "object_key",
]
