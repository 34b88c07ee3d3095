import pytest

from syncer.testing.controlplane import leftover_pids

pytest_plugins = ["syncer.testing.pytest_plugin"]


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Runs after session fixtures are torn down: any etcd/apiserver still alive is a leak.
    left = leftover_pids()
    if left:
        print(f"\nerror: control-plane processes left running after the suite: {left}")
        session.exitstatus = 1


@pytest.fixture
async def api(control_plane):
    """Our async ApiClient as admin on the shared control plane."""
    from informers import ApiClient

    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        yield client
