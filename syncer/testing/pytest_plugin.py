"""pytest fixtures for tests against a real control plane (``pytest_plugins = ["syncer.testing.pytest_plugin"]``).

``control_plane`` (session, shared), ``control_plane_factory`` (private ones, stopped after the test),
``namespace`` (fresh per test), ``admin_client``/``restricted_client`` (the ``kubernetes`` package's) and
``api_client`` (ours, in the test's loop). A control plane that cannot start fails the test, never skips it.
Unless configured, the async fixtures' loop scope defaults to ``function``: ``api_client`` needs the test's loop.
"""

from __future__ import annotations

import uuid
from typing import AsyncIterator, Callable, Iterator, Sequence

import kubernetes
import pytest
import pytest_asyncio

from informers import ApiClient

from .controlplane import ControlPlane

LOOP_SCOPE_OPTION = "asyncio_default_fixture_loop_scope"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The default event loop of async fixtures: the test's own (see the module docstring). Declared again after
    pytest-asyncio declared it without a default; a value in the project's configuration still wins."""
    parser.addini(LOOP_SCOPE_OPTION, "default scope of the asyncio event loop used to execute async fixtures "
                  "(kube-syncer's pytest plugin: function)", default="function")


def kube_client(cp: ControlPlane, context: str = "admin") -> kubernetes.client.ApiClient:
    """An official-client ApiClient for one of the control plane's kubeconfig contexts."""
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(str(cp.kubeconfig), context=context, client_configuration=config)  # type: ignore[no-untyped-call]
    return kubernetes.client.ApiClient(config)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The session's shared control plane."""
    cp = ControlPlane().start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def control_plane_factory() -> Iterator[Callable[..., ControlPlane]]:
    """Start private control planes; each is stopped when the test ends."""
    started: list[ControlPlane] = []

    def factory(extra_apiserver_flags: Sequence[str] = (), graceful_shutdown: bool = False) -> ControlPlane:
        cp = ControlPlane(extra_apiserver_flags=extra_apiserver_flags, graceful_shutdown=graceful_shutdown)
        started.append(cp)
        return cp.start()

    try:
        yield factory
    finally:
        for cp in started:
            cp.stop()


@pytest.fixture(scope="session")
def admin_client(control_plane: ControlPlane) -> Iterator[kubernetes.client.ApiClient]:
    """Admin (system:masters) client of the shared control plane."""
    with kube_client(control_plane, "admin") as client:
        yield client


@pytest.fixture(scope="session")
def restricted_client(control_plane: ControlPlane) -> Iterator[kubernetes.client.ApiClient]:
    """Client of the restricted user (authenticated, no RBAC grants) of the shared control plane."""
    with kube_client(control_plane, "restricted") as client:
        yield client


@pytest_asyncio.fixture
async def api_client(control_plane: ControlPlane) -> AsyncIterator[ApiClient]:
    """Our async ApiClient as admin on the shared control plane, closed after the test."""
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig), "admin") as client:
        yield client


@pytest.fixture
def namespace(admin_client: kubernetes.client.ApiClient) -> Iterator[str]:
    """A fresh namespace; no controller-manager runs, so it stays Terminating after the delete."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = kubernetes.client.CoreV1Api(admin_client)
    core.create_namespace({"metadata": {"name": name}})  # type: ignore[arg-type]
    try:
        yield name
    finally:
        core.delete_namespace(name)
