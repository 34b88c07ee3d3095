"""ClusterProvider: a source of member clusters (multicluster-runtime's ``Provider``), and what it says of each.

Unlike multicluster-runtime's providers, which engage clusters themselves, a provider here only reports its view,
level-based: ``get(name)``, ``names()``, and a callback naming what may have changed. Precedence, sharding, rotation
and teardown are decided downstream, once, so every replica computes the same members from the providers' state.
A member is handed over as a ``Connection``, which knows how it connects, its informers and its ``digest``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

from informers import ApiClient, ClusterSource
from informers.namespace_view import NamespaceHost
from informers.untrusted_kubeconfig import KubeconfigInvalid, client_from_untrusted_kubeconfig, kubeconfig_hash

if TYPE_CHECKING:
    from .member import MemberEnv


def _own_factory(env: MemberEnv, client: ApiClient, name: str) -> ClusterSource:
    """A discovering factory of the member's own over ``client``."""
    return env.make_factory(client, name)


def _management(source: str, management: ApiClient, allowed_exec_commands: Sequence[str]) -> ApiClient:
    """The management client itself (the local cluster and its namespaces)."""
    return management


@dataclass(frozen=True)
class UntrustedKubeconfig:
    """A kubeconfig read from cluster state (a Secret): ``data`` None when the field ``where`` is missing (the
    member is refused with that message until its source changes). ``exec_commands``: exec plugins it may run
    besides ``clusters.allowed_exec_commands``, when the provider wrote its user section from the operator's own
    configuration (a ClusterProfile's access provider) rather than took it from cluster state."""

    data: bytes | None
    where: str = "data key 'kubeconfig'"
    exec_commands: tuple[str, ...] = ()

    local: ClassVar[bool] = False
    informers = staticmethod(_own_factory)

    @property
    def digest(self) -> str:
        """The kubeconfig's hash ("" while it is missing)."""
        return kubeconfig_hash(self.data) if self.data is not None else ""

    def client(self, source: str, management: ApiClient, allowed_exec_commands: Sequence[str]) -> ApiClient:
        """A client under the untrusted kubeconfig's rules (``informers.untrusted_kubeconfig``)."""
        if self.data is None:
            raise KubeconfigInvalid(source, self.where, "is missing")
        return client_from_untrusted_kubeconfig(self.data, allowed_exec_commands=(*allowed_exec_commands,
                                                                                  *self.exec_commands),
                                                source=source)


@dataclass(frozen=True)
class KubeconfigFile:
    """A context of a kubeconfig file of the operator's (trusted); ``entries_digest``: of that context and the
    cluster and user entries it names, so editing one context rotates only its member."""

    path: str
    context: str
    entries_digest: str

    local: ClassVar[bool] = False
    informers = staticmethod(_own_factory)

    @property
    def digest(self) -> str:
        """The file, the context and its entries."""
        return f"{self.path}\0{self.context}\0{self.entries_digest}"

    def client(self, source: str, management: ApiClient, allowed_exec_commands: Sequence[str]) -> ApiClient:
        """The context loaded as kubectl would (the operator's own file: trusted)."""
        return ApiClient.from_kubeconfig(self.path, self.context)


@dataclass(frozen=True)
class LocalConnection:
    """The management cluster itself: the sidecar's own client and informers."""

    local: ClassVar[bool] = True
    digest: ClassVar[str] = "local"
    client = staticmethod(_management)

    @staticmethod
    def informers(env: MemberEnv, client: ApiClient, name: str) -> ClusterSource:
        """The sidecar's own factory (the registry's ``local_factory``), else one of the member's own."""
        return env.local_factory if env.local_factory is not None else env.make_factory(client, name)


@dataclass(frozen=True)
class NamespaceConnection:
    """One namespace of the management cluster as a cluster: the management client (and so its connection),
    with that namespace's view of the informers ``host`` shares among its provider's namespaces
    (``informers.namespace_view``); not part of equality or the digest."""

    namespace: str
    host: NamespaceHost = field(compare=False, repr=False)

    local: ClassVar[bool] = False
    client = staticmethod(_management)

    @property
    def digest(self) -> str:
        """The namespace."""
        return f"namespace\0{self.namespace}"

    def informers(self, env: MemberEnv, client: ApiClient, name: str) -> ClusterSource:
        """This namespace's view of the host's shared informers (the host's factory made by ``make_factory``)."""
        return self.host.view(self.namespace, lambda host: env.make_factory(client, host))


class Connection(Protocol):
    """How a member connects: ``client(...)``, the informers it gets (``informers(...)``), whether it is the local
    cluster, and a ``digest`` equal for connections that connect the same way. A provider may bring a kind of
    its own."""

    @property
    def local(self) -> bool: ...

    @property
    def digest(self) -> str: ...

    def client(self, source: str, management: ApiClient, allowed_exec_commands: Sequence[str]) -> ApiClient: ...

    def informers(self, env: MemberEnv, client: ApiClient, name: str) -> ClusterSource: ...


@dataclass(frozen=True)
class ClusterConfig:
    """What a provider says of cluster ``name``: where it comes from (``source``, for status and logs, e.g.
    ``secret fleet/east``) and how to connect."""

    name: str
    source: str
    connection: Connection

    @property
    def digest(self) -> str:
        """Equal for configs that connect the same way: an unchanged one restarts nothing."""
        return self.connection.digest

    @property
    def local(self) -> bool:
        """Whether this is the management cluster itself."""
        return self.connection.local


@dataclass(frozen=True)
class Conflict:
    """A claim on cluster ``cluster`` that does not register it: ``kind`` and ``key`` name the claimant as status
    shows it (e.g. ``secret`` ``fleet/east``), ``holder`` the source that holds the name ("" if none does);
    ``claim`` the claimant in words (default ``<kind> <key>``, as a source reads: ``secret fleet/east``)."""

    kind: str
    key: str
    cluster: str
    holder: str
    message: str
    claim: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{<kind>: key, "claim", "cluster", "message"}``."""
        return {self.kind: self.key, "claim": self.claim or f"{self.kind} {self.key}", "cluster": self.cluster,
                "message": self.message}


Changed = Callable[[str], None]
"""Called by a provider with a cluster name whenever what ``get(name)`` returns may have changed."""


@runtime_checkable
class ClusterProvider(Protocol):
    """A source of member clusters; ``name`` is its name in the ``clusters.providers`` setting.

    ``start(changed)`` begins watching and returns at once; ``wait_synced(timeout)`` returns True once the
    provider has read its source fully once (its first list), False after ``timeout``; ``stop()`` stops watching,
    awaited. ``conflicts()`` are claims inside this provider that lost (two Secrets naming one cluster), and
    ``status()`` its own part of ``/status`` (what it watches)."""

    name: str

    def get(self, cluster: str) -> ClusterConfig | None: ...

    def names(self) -> set[str]: ...

    def conflicts(self) -> list[Conflict]: ...

    def status(self) -> dict[str, Any]: ...

    async def start(self, changed: Changed) -> None: ...

    async def wait_synced(self, timeout: float) -> bool: ...

    async def stop(self) -> None: ...
