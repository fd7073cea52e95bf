"""How long a flooded c10d store stalls a training step while the agent's rank registry reads it.

Another uid that reaches the job's store floods ``probe_agent/`` with keys (many small ones, and
large values under rank-like names). A training loop (matmuls, ~20 ms steps) runs on the main
thread while the registry, on its own thread as in the agent, does one full read of the store.
Reported: the median step with no read, the longest step during the read, their ratio, and how
long the read took. Run on two checkouts to compare (the registry is the checkout's own):

    python bench/bench_store_flood.py                                  # this checkout
    PROBE_SRC=/path/to/old/checkout python bench/bench_store_flood.py  # before

Options: ``--keys N`` small keys, ``--big N`` values of ``--mib`` MiB named ``rank<i>junk``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(os.environ.get("PROBE_SRC") or Path(__file__).resolve().parents[1])
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=60_000)
    ap.add_argument("--big", type=int, default=20)
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--reads", type=int, default=3)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    from probe_agent.ranks import STORE_PREFIX, RankRegistry
    from probe_protocol.bodies import RankEntry

    torch.set_num_threads(1)
    st = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True, wait_for_workers=False)
    flood = dist.PrefixStore(STORE_PREFIX, st)
    for lo in range(0, args.keys, 50_000):
        n = min(50_000, args.keys - lo)
        flood.multi_set([f"junk{lo + i}" for i in range(n)], [b"y" * 64] * n)
    big = b"\0" * (args.mib << 20)
    for i in range(args.big):
        flood.set(f"rank{i}junk", big)
    flood.set("rank1", big)  # a rank of the job, inflated

    reg = RankRegistry(lambda: RankEntry(0, "http://127.0.0.1:1", "h", os.getpid()),
                       on_group=lambda r, w: None, on_peers=lambda p: None, refresh_s=0.0)
    from datetime import timedelta

    base = st.clone()
    base.set_timeout(timedelta(seconds=120))
    reg.store = dist.PrefixStore(STORE_PREFIX, base)
    reg.world_size = 2

    a = torch.randn(256, 256)

    def step() -> float:
        t0 = time.perf_counter()
        for _ in range(40):
            a @ a
        return time.perf_counter() - t0

    quiet = [step() for _ in range(60)]
    stalls, reads = [], []
    for _ in range(args.reads):
        flood.set("rank1", big)  # inflated again before each read (the new code deletes it)
        flood.add("generation", 1)
        done = threading.Event()

        def read() -> None:
            t0 = time.perf_counter()
            reg._next = 0.0
            reg.tick()
            reads.append(time.perf_counter() - t0)
            done.set()

        threading.Thread(target=read, daemon=True).start()
        during = []
        while not done.is_set():
            during.append(step())
        during.append(step())
        stalls.append(max(during))
    med = statistics.median(quiet)
    print(f"code under test: {ROOT}")
    print(f"store: {args.keys} small keys + {args.big} x {args.mib} MiB rank-named values "
          f"under {STORE_PREFIX}/, rank1 inflated to {args.mib} MiB")
    print(f"median step, no read: {med * 1e3:.1f} ms")
    print(f"longest step during a read: {', '.join(f'{s * 1e3:.0f} ms' for s in stalls)} "
          f"(x{min(stalls) / med:.1f} .. x{max(stalls) / med:.1f} the median)")
    print(f"read took: {', '.join(f'{r:.2f} s' for r in reads)}; registry failures: "
          f"{reg.failures} ({reg.last_error})")


if __name__ == "__main__":
    main()
