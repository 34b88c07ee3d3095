"""Runnable examples and example controller plugins for kube-syncer."""
