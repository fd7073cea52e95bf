"""Adapt DeepSpeedExamples' ``training/cifar/cifar10_deepspeed.py`` (microsoft/DeepSpeedExamples,
unmodified upstream file) to this CPU VM: a real ZeRO job for `probe memory` / `doctor` / `slow`.

Only what cannot run here is changed, each by an exact text replacement that must match (the
script fails loudly if upstream moved): torchvision's ``FakeData`` (3x32x32, 10 classes) instead of
downloading CIFAR10; gloo instead of DeepSpeed's default backend; torch's Adam (``torch_adam``:
DeepSpeed's fused CPU Adam is a C++ build, which here had not finished after 14 minutes);
``MAX_STEPS`` steps (default 300), then the upstream test pass is skipped. The network, the
DeepSpeed config (Adam, WarmupLR, clipping 1.0, ZeRO stage from ``--stage``), the loop and the
dtype choice are upstream's.

    python bench/real/deepspeed_cifar_cpu.py UPSTREAM/cifar10_deepspeed.py OUTDIR
    cd OUTDIR && DS_ACCELERATOR=cpu PROBE=1 torchrun --nproc_per_node 2 cifar10_cpu.py \
        --deepspeed --stage 2 --dtype fp32          # then: probe memory / doctor / slow
"""

from __future__ import annotations

import os
import sys

from edits import adapt_file  # bench/real/edits.py: run as a script, its folder is on sys.path

EDITS = [
    ("    deepspeed.init_distributed()\n",
     "    deepspeed.init_distributed(dist_backend='gloo')\n"),
    ('    trainset = torchvision.datasets.CIFAR10(\n        root="./data", train=True, '
     'download=True, transform=transform\n    )',
     "    trainset = torchvision.datasets.FakeData(\n        size=100_000, image_size=(3, 32, 32),"
     " num_classes=10, transform=transform\n    )"),
    ('    testset = torchvision.datasets.CIFAR10(\n        root="./data", train=False, '
     'download=True, transform=transform\n    )',
     "    testset = torchvision.datasets.FakeData(\n        size=64, image_size=(3, 32, 32),"
     " num_classes=10, transform=transform\n    )"),
    ('                "weight_decay": 3e-7,\n',
     '                "weight_decay": 3e-7,\n                "torch_adam": True,\n'),
    ("            model_engine.step()\n",
     "            model_engine.step()\n"
     "            if model_engine.global_steps >= int(os.environ.get('MAX_STEPS', 300)):\n"
     "                break\n"),
    ("    test(model_engine, testset, local_device, target_dtype)\n", ""),
]


def main() -> None:
    upstream, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    adapt_file(upstream, os.path.join(out, "cifar10_cpu.py"), EDITS)


if __name__ == "__main__":
    main()
