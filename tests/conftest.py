import signal
from typing import Iterator

import pytest

from syncer.testing import ControlPlane
from syncer.testing.controlplane import leftover_pids

pytest_plugins = ["syncer.testing.pytest_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    # A shell without job control (a script, `bash -c`) starts a background job (`pytest ... &`) with SIGINT
    # ignored, and an ignored signal stays ignored across fork and exec: every process the tests start would
    # ignore the Ctrl-C (SIGINT) some tests send it. Python then installs no KeyboardInterrupt handler, nor
    # asyncio.run its cancelling one; only a handler a program sets itself (loop.add_signal_handler) sees it.
    # Handle SIGINT as in a foreground run, whose children start with its default action.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Runs after session fixtures are torn down: any etcd/apiserver still alive is a leak.
    left = leftover_pids()
    if left:
        print(f"\nerror: control-plane processes left running after the suite: {left}")
        session.exitstatus = 1


@pytest.fixture
def api(api_client):
    """The plugin's ``api_client`` (our async ApiClient as admin on the shared control plane), by its short name."""
    return api_client


# Randomized fault tests draw from the ``seed`` fixture: CI runs them with this fixed seed, ``--seed N`` replays
# another (each test prints the one it used).
FIXED_SEED = 20261202


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--seed", type=int, default=FIXED_SEED, help="seed of the randomized fault tests")


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    value = int(request.config.getoption("--seed"))
    print(f"\n{request.node.nodeid}: seed {value} (replay with --seed {value})")
    return value


@pytest.fixture(scope="session")
def member_plane() -> Iterator[ControlPlane]:
    """A second control plane, for the tests that need a member cluster (started once, on first use)."""
    plane = ControlPlane(name="member")
    try:
        plane.start()
        yield plane
    finally:
        plane.stop()
