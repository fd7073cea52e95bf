"""Every private torch name the agent reads (probe_agent/torch_private.py) resolves against the
installed torch: an upgrade that moves one fails here, by name."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

from probe_agent.torch_private import CHECKED, TABLE, Private  # noqa: E402


def _owner(p: Private):
    module, _, cls = p.owner.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, cls) if cls else obj


def _instance(p: Private):
    """One live instance of the row's class, built the cheapest way it can be."""
    cls = _owner(p)
    name = cls.__name__
    if name == "Node":
        return (torch.ones(1, requires_grad=True) * 2).grad_fn
    if name == "GradScaler":
        s = cls("cpu")
        s.scale(torch.ones(1))  # _scale is made lazily, at the first scale()
        return s
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    if name == "LRScheduler":
        return torch.optim.lr_scheduler.StepLR(opt, 1)
    if name == "SequentialLR":
        a, b = torch.optim.lr_scheduler.ConstantLR(opt), torch.optim.lr_scheduler.StepLR(opt, 1)
        return cls(opt, [a, b], milestones=[2])
    if name == "OneCycleLR":
        return cls(opt, max_lr=0.1, total_steps=10)
    if name == "Module":
        return torch.nn.Sequential(torch.nn.Linear(1, 1))
    if name == "OptimizedModule":
        return torch.compile(torch.nn.Linear(1, 1))
    raise AssertionError(f"no way to build a {name}: add one here")


def _resolve(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_the_installed_torch_is_one_the_table_was_checked_on():
    # a new torch: run this file, fix what moved, add the version to CHECKED
    assert torch.__version__.split("+")[0] in CHECKED, torch.__version__


@pytest.mark.parametrize("p", TABLE, ids=lambda p: p.dotted)
def test_every_private_name_resolves(p: Private):
    if p.on == "cuda" and not hasattr(torch._C, "_cuda_getDeviceCount"):
        pytest.skip("a CUDA build's name")
    if p.on == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA build without a device")
    holder = _instance(p) if p.on == "instance" else _owner(p)
    try:
        _resolve(holder, p.name)
    except AttributeError as e:
        raise AssertionError(f"{p.dotted} (read by {p.used_by}) is gone in torch "
                             f"{torch.__version__}: {e}; without it {p.missing}") from None


def test_the_table_names_each_row_once():
    names = [p.dotted for p in TABLE]
    assert len(names) == len(set(names))
