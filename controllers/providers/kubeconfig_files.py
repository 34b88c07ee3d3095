"""KubeconfigFilesProvider: every context of one or more kubeconfig files as a member (kubectl's contexts as a fleet).

The files are the operator's, trusted: a context is loaded as ``kubectl`` would (``KubeconfigFile``), and named by
any non-empty string. Unlike kubectl, each context reads only its own file. A member's ``digest`` covers its
context, cluster and user entries, so one edit rotates that member only. Files are re-read when ``stat`` changes
(checked every ``reload_interval``); a broken file's contexts leave until it is fixed; one context name in two files
is held by the first file listed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from loguru import logger

from informers.kubeconfig import safe_load_yaml

from ..provider import ClusterConfig, Conflict, KubeconfigFile
from .watching import WatchingProvider

Signature = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size


@dataclass(frozen=True)
class KubeconfigFilesOptions:
    """Members from the operator's own kubeconfig files, table ``[clusters.kubeconfig_files]``: each context is a
    member named after it. Unlike a Secret's, these kubeconfigs are trusted, as ``kubectl`` trusts them: file
    references and exec plugins work.

    - ``paths``: the files (``~`` expanded; each must exist; at least one when the provider is listed).
    - ``contexts``: the contexts that are members (``[]``: every context of every file).
    - ``reload_interval``: how often the files' modification times are checked, to pick up a changed file.
    """

    paths: Sequence[str] = ()
    contexts: Sequence[str] = ()
    reload_interval: float = 5.0


@dataclass(frozen=True)
class _Read:
    """A file as last read: its ``stat`` signature (None if it could not be read) and its contexts' digests, or
    why it has none."""

    signature: Signature | None
    contexts: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None


class KubeconfigInvalidFile(ValueError):
    """A kubeconfig file that does not have the shape of one."""


class KubeconfigFilesProvider(WatchingProvider):
    """Member clusters from the contexts of kubeconfig files (see the module docstring); ``name`` is its name in the
    ``clusters.providers`` setting."""

    def __init__(self, options: KubeconfigFilesOptions, *, name: str = "kubeconfig-files") -> None:
        self.options = options
        super().__init__(name)
        self.paths = list(dict.fromkeys(os.path.abspath(os.path.expanduser(p)) for p in options.paths))
        self._files: dict[str, _Read] = {}
        self._log = logger.bind(component=name)

    # -- the view ----------------------------------------------------------------------------------------
    def get(self, cluster: str) -> ClusterConfig | None:
        """Context ``cluster`` of the first file (in ``paths`` order) that has it."""
        for path in self.paths:
            read = self._files.get(path)
            if read is not None and cluster in read.contexts:
                return ClusterConfig(cluster, f"file {path} context {cluster}",
                                     KubeconfigFile(path, cluster, read.contexts[cluster]))
        return None

    def names(self) -> set[str]:
        """Every context of the files read (that ``contexts`` lets through)."""
        return {name for read in self._files.values() for name in read.contexts}

    def conflicts(self) -> list[Conflict]:
        """The contexts that a file listed earlier also has."""
        holders: dict[str, str] = {}
        out: list[Conflict] = []
        for path in self.paths:
            read = self._files.get(path)
            for name in sorted(read.contexts if read is not None else ()):
                holder = holders.setdefault(name, path)
                if holder != path:
                    out.append(Conflict("file", f"{path} context {name}", name, f"file {holder}",
                                        f"context {name!r} is held by file {holder}, listed first"))
        return out

    def status(self) -> dict[str, Any]:
        """Each file with its contexts or why it has none, and the wanted contexts no file has."""
        files = []
        for path in self.paths:
            read = self._files.get(path)
            files.append({"path": path, "contexts": sorted(read.contexts) if read is not None else [],
                          "error": read.error if read is not None else None})
        missing = [c for c in self.options.contexts if c not in self.names()]
        return {"provider": self.name, "kind": "kubeconfig-files", "files": files, "missing_contexts": missing,
                "reload_interval": self.options.reload_interval, "synced": self._synced.is_set()}

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def _watch_source(self) -> None:
        while True:
            self.check()
            self._synced.set()
            await asyncio.sleep(self.options.reload_interval)

    def check(self) -> None:
        """Read again every file whose ``stat`` changed, and tell ``changed`` each name whose config did."""
        before = {name: self.get(name) for name in self.names()}
        for path in self.paths:
            previous = self._files.get(path)
            read = _read(path, previous, self.options.contexts)
            if read is previous:
                continue
            self._files[path] = read
            if read.error is not None and (previous is None or previous.error != read.error):
                self._log.warning("kubeconfig file {}: {}; its contexts are not members until it is fixed", path,
                                  read.error)
            elif read.error is None and previous is not None and previous.error is not None:
                self._log.info("kubeconfig file {} read again: {} contexts", path, len(read.contexts))
        after = {name: self.get(name) for name in self.names()}
        for name in sorted(before.keys() | after.keys()):
            if before.get(name) != after.get(name):
                self._tell(name)


def _read(path: str, previous: _Read | None, wanted: Sequence[str]) -> _Read:
    """The file at ``path`` read again, or ``previous`` itself if its ``stat`` is unchanged."""
    try:
        st = os.stat(path)
        signature = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if previous is not None and previous.signature == signature:
            return previous
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        error = e.strerror or type(e).__name__
        if previous is not None and previous.signature is None and previous.error == error:
            return previous
        return _Read(None, error=error)
    try:
        contexts = context_digests(safe_load_yaml(data))
    except KubeconfigInvalidFile as e:
        return _Read(signature, error=str(e))
    except Exception as e:  # the YAML parser's errors name the line and column
        return _Read(signature, error=f"does not parse: {e}")
    if wanted:
        contexts = {name: digest for name, digest in contexts.items() if name in wanted}
    return _Read(signature, contexts)


def context_digests(doc: Any) -> dict[str, str]:
    """Each context of the kubeconfig ``doc`` (parsed) by name, with the digest of its entry and of the cluster
    and user entries it names; KubeconfigInvalidFile if ``doc`` is not shaped as a kubeconfig."""
    if doc is None:
        return {}  # an empty file: no contexts, as for kubectl
    if not isinstance(doc, dict):
        raise KubeconfigInvalidFile(f"is not a kubeconfig (a mapping at the top), but a {type(doc).__name__}")
    entries = {kind: _named(doc, kind) for kind in ("clusters", "users", "contexts")}
    digests = {}
    for name, entry in entries["contexts"].items():
        context = entry.get("context") or {}
        if not isinstance(context, dict):
            raise KubeconfigInvalidFile(f"context {name!r}: 'context' is not a mapping")
        referenced = {"context": entry, "cluster": entries["clusters"].get(context.get("cluster")),
                      "user": entries["users"].get(context.get("user"))}
        digests[name] = hashlib.sha256(json.dumps(referenced, sort_keys=True, default=str).encode()).hexdigest()
    return digests


def _named(doc: dict[str, Any], kind: str) -> dict[Any, dict[str, Any]]:
    """The entries of list ``kind`` by name (the first of a name, as kubectl takes it)."""
    items = doc.get(kind) or []
    if not isinstance(items, list):
        raise KubeconfigInvalidFile(f"{kind!r} is not a list")
    named: dict[Any, dict[str, Any]] = {}
    for i, item in enumerate(items):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise KubeconfigInvalidFile(f"entry {i} of {kind!r} has no name (a non-empty string)")
        named.setdefault(name, item)
    return named
