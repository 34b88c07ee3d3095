"""A real local control plane (etcd + kube-apiserver + kubectl built from pinned Go modules) for tests."""

from .assets import Assets, AssetsError, ensure_assets
from .controlplane import ControlPlane, ControlPlaneError

__all__ = ["Assets", "AssetsError", "ControlPlane", "ControlPlaneError", "ensure_assets"]
