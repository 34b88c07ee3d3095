"""``python -m syncer.testing``: build (or find) the control-plane binaries and print their directory."""

import sys

from .assets import AssetsError, ensure_assets

try:
    assets = ensure_assets()
except AssetsError as e:
    sys.exit(f"error: {e}")
print(assets.kube_apiserver.parent)
