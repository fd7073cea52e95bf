"""Adapt pytorch/examples' ``distributed/FSDP2/example.py`` (unmodified upstream files: copy
``example.py``, ``model.py``, ``checkpoint.py``, ``utils.py`` into OUTDIR) to this CPU VM: a real
FSDP2 job (``fully_shard`` per layer and on the root, Adam on DTensor shards, clipping) for
`probe doctor` / `slow` / `memory`.

Only what cannot run here is changed, each by an exact text replacement that must match: the
"at least 2 GPUs" exit is skipped (upstream's own CPU branch then picks ``cpu`` and gloo; no
``device_id``: torch takes only an accelerator there), and the
loop runs ``STEPS`` steps (default 300) instead of 10, so there is something to look at.

    python bench/real/fsdp2_example_cpu.py OUTDIR          # writes OUTDIR/example_cpu.py
    cd OUTDIR && PROBE=1 STEPS=300 torchrun --nproc_per_node 2 example_cpu.py
"""

from __future__ import annotations

import os
import sys

from edits import adapt_file  # bench/real/edits.py: run as a script, its folder is on sys.path

EDITS = [
    ("    if not verify_min_gpu_count(min_gpus=_min_gpu_count):\n",
     "    if torch.accelerator.is_available() and "
     "not verify_min_gpu_count(min_gpus=_min_gpu_count):\n"),
    ("    torch.distributed.init_process_group(backend=backend, device_id=device)\n",
     "    torch.distributed.init_process_group(backend=backend)\n"),
    ("    for _ in range(10):\n", "    for _ in range(int(os.environ.get('STEPS', 300))):\n"),
]


def main() -> None:
    out = sys.argv[1]
    adapt_file(os.path.join(out, "example.py"), os.path.join(out, "example_cpu.py"), EDITS)


if __name__ == "__main__":
    main()
