"""The post-mortem copy's cost on step time, as a paired ratio, and the bytes it writes.

One process, one agent (both arms agent-loaded: loading the agent alone changes a CPU job's
speed, see docs/decisions/measurement-method.md), a small MLP trained on CPU with the default
tracing (every:10, so python.torch_trace grows as in a real job). Blocks of ``--block-s``
seconds alternate, round after round: the copy's refresh thread stopped (``off``) or refreshing
every ``--every-s`` (``on``). Per round the ratio of the median step time on/off (drift and the
neighbours' load hit both halves of a round alike); reported: the median ratio over rounds with
its spread, the refresh's own time, and the bytes written per minute of ``on`` time.

    PYTHONPATH=. python bench/bench_postmortem.py [--rounds 8] [--block-s 20] [--every-s 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--block-s", type=float, default=20.0)
    p.add_argument("--every-s", type=float, default=10.0)
    p.add_argument("--width", type=int, default=256)
    args = p.parse_args()
    run = tempfile.mkdtemp(prefix="probe-bench-pm-")
    os.environ.update(PROBE_RUN_DIR=run, PROBE_PORT="0", PROBE_POSTMORTEM="always",
                      PROBE_POSTMORTEM_EVERY_S=str(args.every_s), PROBE_TRACE_NATIVE="off")
    import torch
    import torch.nn as nn

    import probe_agent

    torch.set_num_threads(1)  # one training core: the copy's threads compete for the other
    agent = probe_agent.start()
    copy = agent.postmortem.copy
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(w, w), nn.ReLU())])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(64, w)

    def block(seconds: float) -> list[float]:
        """Wall time of each step (the honest cost: the copy's threads take cores and the GIL
        from the training thread)."""
        times = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        return times

    block(3.0)  # warm-up
    copy.stop()
    ratios, on_s, written0 = [], 0.0, copy.bytes_written
    refresh_s: list[float] = []
    for r in range(args.rounds):
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        med = {}
        for arm in order:
            if arm == "on":
                copy.start()
                t0 = time.perf_counter()
            med[arm] = statistics.median(block(args.block_s))
            if arm == "on":
                copy.stop()
                on_s += time.perf_counter() - t0
                refresh_s.append(copy.last_refresh_s)
        ratios.append(med["on"] / med["off"])
        print(f"round {r}: off {med['off'] * 1e3:.2f} ms  on {med['on'] * 1e3:.2f} ms  "
              f"ratio {ratios[-1]:.4f}", file=sys.stderr)
    written = copy.bytes_written - written0
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(json.dumps({
        "every_s": args.every_s, "width": args.width, "block_s": args.block_s,
        "rounds": args.rounds,
        "ratio_median": round(statistics.median(ratios), 4),
        "ratio_iqr": [round(q[0], 4), round(q[2], 4)],
        "refresh_s_median": round(statistics.median(refresh_s), 4) if refresh_s else None,
        "bytes_written_per_min": round(written / on_s * 60) if on_s else None,
        "copy_bytes_on_disk": json.load(open(os.path.join(copy.path, "meta.json")))["bytes"],
    }))
    probe_agent.stop()


if __name__ == "__main__":
    main()
