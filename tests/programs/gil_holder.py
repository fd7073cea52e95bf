"""A rank whose main thread, on cue, spins inside a C function that holds the GIL.

It waits in ``waiting_room`` (time.sleep, with a recognisable local) until ``--go-file``
exists, then calls ``hold_gil`` -> ``spin_in_c`` -> the C ``spin(seconds)`` loaded with
``ctypes.PyDLL`` (PyDLL keeps the GIL during the call), then waits again. Each return from the
C call appends a line to ``--done-file``. ``--workers N`` starts a DataLoader's N worker
processes first (children to read from outside). With ``--train``, the waiting room takes an
SGD step (lr 0.1) of a tiny model every 20 ms, so step-boundary actions have steps to ride on.
The agent is started with ``probe_agent.start()`` (configured from PROBE_* variables);
readiness is ``--ready-file`` ({pid, url, unix_socket}).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import time
from collections.abc import Callable


def spin_in_c(lib: ctypes.PyDLL, seconds: float) -> float:
    return lib.spin(seconds)


def hold_gil(lib: ctypes.PyDLL, seconds: float) -> float:
    return spin_in_c(lib, seconds)


def waiting_room(go_file: str, step: Callable[[], None] | None = None) -> None:
    marker = "waiting-for-go"  # noqa: F841 - the test reads it back from the locals
    # os.access is C: os.path.exists is a Python function, and a backtrace taken inside it
    # would show `exists` above this frame (the tests read this frame as the innermost)
    while not os.access(go_file, os.F_OK):
        if step is not None:
            step()
        time.sleep(0.02)
    os.unlink(go_file)


def sgd_step() -> Callable[[], None]:
    import torch

    net = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

    def step() -> None:
        optimizer.zero_grad()
        net(torch.randn(2, 4)).sum().backward()
        optimizer.step()

    return step


def start_workers(n: int) -> object:
    """A DataLoader with ``n`` persistent workers, started (one batch taken) and kept alive:
    children of this rank for ``backtrace?children=1``, idle in their index queue."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = iter(DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4, num_workers=n,
                             persistent_workers=True))
    next(loader)
    return loader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lib", required=True)
    p.add_argument("--ready-file", required=True)
    p.add_argument("--go-file", required=True)
    p.add_argument("--done-file", required=True)
    p.add_argument("--spin-s", type=float, default=4.0)
    p.add_argument("--train", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args()
    lib = ctypes.PyDLL(args.lib)
    lib.spin.restype, lib.spin.argtypes = ctypes.c_double, [ctypes.c_double]
    import probe_agent

    agent = probe_agent.start()
    step = sgd_step() if args.train else None
    loader = start_workers(args.workers) if args.workers else None  # noqa: F841 - kept alive
    tmp = args.ready_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "url": agent.url, "unix_socket": agent.unix_path}, f)
    os.replace(tmp, args.ready_file)
    while True:
        waiting_room(args.go_file, step)
        hold_gil(lib, args.spin_s)
        with open(args.done_file, "a") as f:
            f.write(f"{time.time()}\n")


if __name__ == "__main__":
    main()
