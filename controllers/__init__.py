"""Controllers managed by their GVRs' availability: ControllerManager, work queue and a controller helper."""

from .conditions import (
    find_status_condition, is_status_condition_true, remove_status_condition, set_status_condition,
)
from .context import ControllerContext, ReconcileContext, ReconcileStats
from .controller import Controller
from .equality import semantic_equal
from .events import EventRecorder, EventType
from .fence import OPEN, Fence
from .finalizers import add_finalizer, has_finalizer, remove_finalizer
from .manager import (
    CONTROLLER_NAME_PREFIX, ControllerManager, ControllerState, ControllerStatus, ManagedController,
)
from .metrics import ReconcileMetrics, reconcile_metrics
from .owners import AlreadyOwnedError, owner_requests, set_controller_reference, set_owner_reference
from .predicates import (
    Predicate, WatchEvent, and_, annotations_changed, fields_match, generation_changed, labels_changed, not_, or_,
    resource_version_changed,
)
from .priority import LOW_PRIORITY
from .ratelimiter import (
    BucketRateLimiter, ItemExponentialFailureRateLimiter, MaxOfRateLimiter, RateLimiter,
    default_controller_rate_limiter,
)
from .reconcile import Request, Result, TerminalError
from .retry import DEFAULT_RETRY, RetryBackoff, retry_on_conflict
from .union_controller import UnionController
from .upsert import OperationResult, create_or_patch, create_or_update
from .workqueue import QueueShutDown, WorkQueue

__all__ = [
    "BucketRateLimiter", "CONTROLLER_NAME_PREFIX", "LOW_PRIORITY", "Controller", "ControllerContext", "ControllerManager",
    "ControllerState", "ControllerStatus", "Fence", "ItemExponentialFailureRateLimiter", "ManagedController",
    "MaxOfRateLimiter", "OPEN", "QueueShutDown", "RateLimiter", "ReconcileStats", "Request", "Result",
    "TerminalError", "UnionController", "WorkQueue", "default_controller_rate_limiter",
    "AlreadyOwnedError", "DEFAULT_RETRY", "EventRecorder", "EventType", "OperationResult", "RetryBackoff",
    "add_finalizer", "create_or_patch", "create_or_update", "has_finalizer", "owner_requests", "remove_finalizer",
    "retry_on_conflict", "semantic_equal", "set_controller_reference", "set_owner_reference",
    "Predicate", "ReconcileContext", "ReconcileMetrics", "WatchEvent", "and_", "annotations_changed", "fields_match",
    "generation_changed", "labels_changed", "not_", "or_", "reconcile_metrics", "resource_version_changed",
    "find_status_condition", "is_status_condition_true", "remove_status_condition", "set_status_condition",
]
