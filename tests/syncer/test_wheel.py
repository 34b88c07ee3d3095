"""The package as a user installs it: ``python -m build`` makes an sdist and, from it, a wheel; the wheel goes into
a clean virtualenv (its dependencies from the package index, nothing from this checkout: no PYTHONPATH, no
system site-packages), and its ``syncer`` script prints the version of informers/version.py, checks the example
settings and runs the example plugins from the unpacked sdist, as a user of a release would from its source.

One module-scoped install (about a minute with pip's cache warm) serves every test here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Iterator, NamedTuple

import kubernetes
import pytest

from informers.version import __version__
from syncer.testing import ControlPlane
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


class Installed(NamedTuple):
    wheel: Path
    source: Path  # the unpacked sdist
    env: dict[str, str]  # PATH leads to the virtualenv's bin; nothing points back at this checkout

    def syncer(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["syncer", *args], cwd=self.source, env=self.env, capture_output=True, text=True,
                              timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "KUBECONFIG") and not k.startswith("SYNCER_")}
    build = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(ROOT)],
                           env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    [wheel] = (tmp / "dist").glob("kube_syncer-*.whl")
    [sdist] = (tmp / "dist").glob("kube_syncer-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "src", filter="data")
    [source] = (tmp / "src").iterdir()

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                          str(wheel)], env=env, capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    yield Installed(wheel, source, {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"})


def test_the_wheel_holds_the_packages_and_their_data_and_the_sdist_the_examples(installed: Installed) -> None:
    assert installed.wheel.name == f"kube_syncer-{__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    assert {"informers/py.typed", "controllers/py.typed", "syncer/py.typed", "syncer/testing/gobuild/go.mod",
            "syncer/testing/gobuild/go.sum"} <= names
    assert any(re.fullmatch(r"syncer/builtin/cached_resources/crds/.+\.json", n) for n in names)
    assert {n.split("/")[0] for n in names if not n.startswith("kube_syncer-")} == {
        "informers", "controllers", "syncer"}  # no `examples` (nor `tests`) package in site-packages
    for path in ("CHANGELOG.md", "README.md", "examples/settings.toml", "examples/crds/widget.json",
                 "examples/widget.yaml", "examples/plugins/widget_status.py"):
        assert (installed.source / path).is_file(), path


def test_the_installed_script_says_the_single_sourced_version(installed: Installed) -> None:
    for args in (["--version"], ["version"]):
        out = installed.syncer(*args)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"kube-syncer {__version__} (python "), out.stdout
    # The packages come from the virtualenv, not from this checkout.
    where = subprocess.run(["python", "-c", "import syncer, informers.version as v; print(syncer.__file__, "
                            "v.__version__)"], cwd="/", env=installed.env, capture_output=True, text=True,
                           timeout=60)
    assert where.returncode == 0 and "site-packages" in where.stdout and str(ROOT) not in where.stdout, where


def test_check_config_loads_the_example_plugins_from_the_sdist(installed: Installed, tmp_path: Path) -> None:
    # By dotted path from the sdist's root, as the README says.
    out = installed.syncer("check-config", "--local", "--settings", "examples/settings.toml")
    assert out.returncode == 0, out.stderr
    assert "plugins OK: 2 controller(s): configmap-mirror, widget-status" in out.stdout, out.stdout
    # By file path from anywhere else.
    plugin = installed.source / "examples/plugins/widget_status.py"
    (tmp_path / "s.toml").write_text(f'plugins = ["{plugin}"]\n')
    out = subprocess.run(["syncer", "check-config", "--local", "--settings", "s.toml"], cwd=tmp_path,
                         env=installed.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "plugins OK: 1 controller(s): widget-status" in out.stdout, out.stdout


def test_the_example_plugin_runs_from_the_installed_wheel(installed: Installed, control_plane: ControlPlane,
                                                          admin_client: kubernetes.client.ApiClient,
                                                          namespace: str, tmp_path: Path) -> None:
    # examples/settings.toml as shipped, on a free port, with the mirror's label and target our own: the control
    # plane is shared with other tests.
    settings = tmp_path / "settings.toml"
    text = (installed.source / "examples/settings.toml").read_text()
    settings.write_text(text.replace("127.0.0.1:8080", f"127.0.0.1:{free_port()}")
                        .replace('"kube-syncer.io/mirror=true"', f'"kube-syncer.io/wheel={namespace}"')
                        .replace('target_namespace = "mirror"', f'target_namespace = "{namespace}"'))
    log = tmp_path / "run.log"
    run = subprocess.Popen(["syncer", "run", "--settings", str(settings), "--kubeconfig",
                            str(control_plane.kubeconfig)], cwd=installed.source, env=installed.env,
                           stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        core = kubernetes.client.CoreV1Api(admin_client)
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "app", "labels": {
            "kube-syncer.io/wheel": namespace}}, "data": {"k": "v"}})
        deadline = time.monotonic() + 60
        while f"mirrored {namespace}/app to {namespace}/{namespace}.app" not in log.read_text():
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        assert core.read_namespaced_config_map(f"{namespace}.app", namespace).data == {"k": "v"}
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 0, log.read_text()[-3000:]
