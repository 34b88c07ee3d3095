"""Example controller plugins (load them with ``plugins = ["examples.plugins.<name>"]``)."""
