"""The writes of the fence-test plugins (``tests/plugins/fence_writer.py``): who stamped each modification of one
ConfigMap, in order, watched in a thread of its own."""

from __future__ import annotations

import threading

import kubernetes

from syncer.testing.pytest_plugin import kube_client


class Writes:
    """Watches one ConfigMap in a thread and records the writer stamped on each modification, in order."""

    def __init__(self, cp, name: str) -> None:
        self.writers: list[str] = []
        self._stop = threading.Event()
        self._api = kubernetes.client.CoreV1Api(kube_client(cp))
        self._name = name
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rv = self._api.read_namespaced_config_map(self._name, "default").metadata.resource_version
        while not self._stop.is_set():
            w = kubernetes.watch.Watch()
            for ev in w.stream(self._api.list_namespaced_config_map, "default", resource_version=rv,
                               field_selector=f"metadata.name={self._name}", timeout_seconds=2):
                rv = ev["object"].metadata.resource_version
                writer = (ev["object"].metadata.annotations or {}).get("fence-test/writer")
                if ev["type"] == "MODIFIED" and writer:
                    self.writers.append(writer)
                if self._stop.is_set():
                    break

    def after_first(self, writer: str) -> list[str]:
        """Writers of every write that came after ``writer``'s first one."""
        ws = list(self.writers)
        return ws[ws.index(writer) + 1:] if writer in ws else []

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
