"""Controllers managed by their GVRs' availability: ControllerManager, work queue and a controller helper."""

from .context import ControllerContext
from .controller import Controller
from .manager import CONTROLLER_NAME_PREFIX, ControllerManager, ControllerStatus, ManagedController
from .ratelimiter import (
    BucketRateLimiter, ItemExponentialFailureRateLimiter, MaxOfRateLimiter, RateLimiter,
    default_controller_rate_limiter,
)
from .reconcile import Request, Result
from .workqueue import QueueShutDown, WorkQueue

__all__ = [
    "BucketRateLimiter", "CONTROLLER_NAME_PREFIX", "Controller", "ControllerContext", "ControllerManager",
    "ControllerStatus", "ItemExponentialFailureRateLimiter", "ManagedController", "MaxOfRateLimiter",
    "QueueShutDown", "RateLimiter", "Request", "Result", "WorkQueue", "default_controller_rate_limiter",
]
