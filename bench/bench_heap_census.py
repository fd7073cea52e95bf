"""How long a heap walk (``probe memory --tensors``, model discovery) stalls the training thread
on a job with a large heap.

One process: ``--objects`` live objects (plain instances, dicts, lists: what a data pipeline or
a tokenizer leaves on the heap) plus some tensors, a training loop on the main thread (~10 ms
matmul steps), and ``--calls`` heap walks (probe_agent.heapscan.live_objects, as the tensor
census makes them) from another thread. Reported: the median step, the longest step during
each walk, and each walk's time. Run on two checkouts to compare:

    python bench/bench_heap_census.py                                  # this checkout
    PROBE_SRC=/path/to/old/checkout python bench/bench_heap_census.py  # before
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


class Row:
    __slots__ = ("a", "b")

    def __init__(self, i: int) -> None:
        self.a, self.b = i, None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=1_260_000)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    import torch

    from probe_agent.heapscan import live_objects

    torch.set_num_threads(1)
    third = args.objects // 3
    heap = ([Row(i) for i in range(third)] + [{"i": i} for i in range(third)]
            + [[i] for i in range(third)])
    tensors = [torch.zeros(4) for _ in range(20_000)]
    a = torch.randn(160, 160)

    def step() -> float:
        t0 = time.perf_counter()
        for _ in range(20):
            a @ a
        return time.perf_counter() - t0

    quiet = [step() for _ in range(100)]
    stalls, walks = [], []
    for _ in range(args.calls):
        done = threading.Event()

        def walk() -> None:
            t0 = time.perf_counter()
            found = live_objects({"tensors": (torch.Tensor,)})
            walks.append((time.perf_counter() - t0, len(found["tensors"])))
            done.set()

        time.sleep(0.2)
        threading.Thread(target=walk, daemon=True).start()
        during = []
        while not done.is_set():
            during.append(step())
        during.append(step())
        stalls.append(max(during))
    med = statistics.median(quiet)
    print(f"code under test: {ROOT}; heap: {len(heap)} objects + {len(tensors)} tensors")
    print(f"median step {med * 1e3:.1f} ms; longest step during a walk: "
          f"{', '.join(f'{s * 1e3:.0f}' for s in stalls)} ms (median "
          f"{statistics.median(stalls) * 1e3:.0f} ms, x{statistics.median(stalls) / med:.1f})")
    print(f"walks: {', '.join(f'{w * 1e3:.0f}' for w, _ in walks)} ms; tensors found "
          f"{walks[0][1]}")


if __name__ == "__main__":
    main()
