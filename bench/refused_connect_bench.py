"""CPU of one HTTP/2 connect that the server refuses (nothing listens on the port), on uvloop, as a fleet's
reflectors and /readyz probes pay it hundreds of times a second while their API server is down.

    .venv/bin/python bench/refused_connect_bench.py [--connects 2000]

Prints the best of 5 rounds, in microseconds of process CPU per connect, and the GC passes over all rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import socket
import ssl
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from informers.http2 import H2Connection  # noqa: E402


async def measure(connects: int) -> tuple[float, int]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    passes = 0

    def count(phase: str, info: dict[str, int]) -> None:
        nonlocal passes
        passes += phase == "start"

    gc.callbacks.append(count)
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(connects):
            try:
                await H2Connection.connect("127.0.0.1", port, context, "localhost", "localhost", 30.0, 15.0, 90.0)
            except OSError:
                pass
        best = min(best, (time.process_time() - start) / connects * 1e6)
    gc.callbacks.remove(count)
    return best, passes


def main() -> None:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connects", type=int, default=2000)
    args = p.parse_args()
    best, passes = uvloop.run(measure(args.connects))
    print(f"refused connect: {best:.1f} us CPU each (best of 5 x {args.connects}); GC passes {passes}")


if __name__ == "__main__":
    main()
