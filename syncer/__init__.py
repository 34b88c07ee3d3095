"""kube-syncer's process runtime: the sidecar, its CLI and the testing helpers (``syncer.testing``)."""
