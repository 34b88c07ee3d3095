"""Asyncio shared index informers for any Kubernetes resource, with client-go semantics."""

from .backoff import Backoff
from .client import ApiClient
from .errors import ApiError
from .factory import DynamicSharedInformerFactory
from .gvr import GVR
from .lister import Lister
from .metrics import InformerMetrics
from .reflector import Reflector, ReflectorOptions
from .selector import LabelSelector, SelectorError
from .shared_informer import EventHandler, FuncHandler, HandlerRegistration, SharedIndexInformer
from .store import DeletedFinalStateUnknown, Store, object_key
from .transforms import drop_managed_fields

__all__ = [
    "ApiClient", "ApiError", "Backoff", "DeletedFinalStateUnknown", "DynamicSharedInformerFactory", "EventHandler",
    "FuncHandler", "GVR", "HandlerRegistration", "InformerMetrics", "LabelSelector", "Lister", "Reflector",
    "ReflectorOptions", "SelectorError", "SharedIndexInformer", "Store", "drop_managed_fields", "object_key",
]
