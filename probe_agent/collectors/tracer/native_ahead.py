"""``python -m probe_agent.collectors.tracer.native_ahead``: build (or find) the tracer's C++ hot
path for this Python and torch now, in the foreground, so that no rank compiles it: what
`probe build-native` runs, and what a cluster image runs once to ship ``PROBE_NATIVE_DIR``
built. Exit 0 when the build loads, 1 with the reason otherwise."""

from __future__ import annotations

import sys

from .trace_native import NativeLoader, cache_dir, ext_name


def main() -> int:
    import torch

    loader = NativeLoader()
    loader.request(torch, "auto")
    loader.ready.wait()
    if loader.module is None:
        print(f"probe: the C++ hot path is not available: {loader.describe()}", file=sys.stderr)
        return 1
    print(f"probe: the C++ hot path is built and loads: {cache_dir() / ext_name(torch)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
