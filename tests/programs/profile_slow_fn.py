"""Two gloo ranks training an MLP (aten::addmm is its heaviest operator), with a deliberately slow
pure-Python function on the training thread every step (issue 16: `probe profile`, `probe flame`).

``--slow-ms N``: ``slow_python_function`` busy-loops N ms per step in Python, so a sampled flame
graph must show it among the widest frames. ``--odd-rank-ms N``: the last rank also runs
``odd_rank_extra_work`` N ms per step (a rank difference). ``--user-profiler-file F``: once F
exists, the program starts its own ``torch.profiler.profile()`` and keeps it running (a user
profiling by hand), so `probe profile` must be refused while training goes on; each rank writes
``user_profiler_rank{N}`` next to F once its profiler runs. Each step is logged to
``--log-dir/rank{N}.txt`` (the last step number), so a test can see that training continues.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn as nn
from hang_common import announce, parse_args


def slow_python_function(ms: float) -> int:
    """Pure Python busy work (no C call to hide in): the flame graph's widest frame."""
    end = time.perf_counter() + ms / 1e3
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def odd_rank_extra_work(ms: float) -> int:
    """What only the last rank does: a rank difference for the flame graph to name."""
    return slow_python_function(ms)


def main() -> None:
    args = parse_args([("--slow-ms", {"type": float, "default": 0.0}),
                       ("--user-profiler-file", {"default": None}),
                       ("--log-dir", {"default": None}),
                       ("--odd-rank-ms", {"type": float, "default": 0.0})])
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randn(64, 1)
    user_prof = None
    step = 0
    try:
        while not (args.stop_file and os.path.exists(args.stop_file)):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():
                torch.distributed.all_reduce(p.grad)
            optimizer.step()
            if args.slow_ms:
                slow_python_function(args.slow_ms)
            if args.odd_rank_ms and rank == torch.distributed.get_world_size() - 1:
                odd_rank_extra_work(args.odd_rank_ms)
            step += 1
            if step == 3:
                announce(args.ready_dir)
            if args.log_dir:
                with open(os.path.join(args.log_dir, f"rank{rank}.txt"), "w") as f:
                    f.write(str(step))
            if user_prof is None and args.user_profiler_file and os.path.exists(
                    args.user_profiler_file):
                user_prof = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU])
                user_prof.start()
                marker = os.path.join(os.path.dirname(args.user_profiler_file),
                                      f"user_profiler_rank{rank}")
                open(marker, "w").close()
    finally:
        if user_prof is not None:  # exiting with a profiler on crashes the interpreter
            user_prof.stop()

if __name__ == "__main__":
    main()
