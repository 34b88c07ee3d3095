"""One module per mode, each a ``Workload`` (``syncer/workload.py``); ``syncer/wiring.py`` imports only the one the
settings ask for."""
