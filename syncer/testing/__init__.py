"""Testing controllers and plugins: a real local control plane (etcd + kube-apiserver + kubectl built from pinned Go
modules), a plugin run against it in the test's event loop, AdmissionRequests for webhook handlers, and waiting
for conditions. The pytest fixtures are in ``syncer.testing.pytest_plugin``."""

from .admission import admission_request
from .assets import Assets, AssetsError, ensure_assets
from .controlplane import ControlPlane, ControlPlaneError
from .plugin_runner import RunningPlugin, run_plugin
from .wait import eventually

__all__ = ["Assets", "AssetsError", "ControlPlane", "ControlPlaneError", "RunningPlugin", "admission_request",
           "ensure_assets", "eventually", "run_plugin"]
