"""The version of the kube-syncer distribution (informers, controllers and syncer alike), written here only.

setup.cfg reads it (``version = attr: informers.version.__version__``) and so do ``syncer --version`` and the
User-Agent; it lives in the lowest package so that every package can import it. A source checkout that was
never installed reports it too, where ``importlib.metadata`` would have nothing (or an older install) to say.
"""

__version__ = "0.1.0"
