"""torch.compile under the tracer: dynamo must never compile the tracer's ``nn.Module.__call__``
wrapper (or the agent code it calls) as a frame of its own. Before: one code object for every
module's call collected a cache entry per module type and argument count (``Recompiling
function traced_call``: guards on ``type(self)`` and ``len(args)``), 14-16 recompiles on a real
script where the job alone had 4."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x: Any) -> Any:
        y = self.norm(torch.relu(self.fc(x)))
        torch._dynamo.graph_break()  # the frames after a break are compiled one by one
        return x + y


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.blocks = nn.Embedding(16, 8), nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 16)

    def forward(self, idx: Any) -> Any:
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _compiled(steps: int = 5) -> tuple[list[str], dict[str, int]]:
    """The frames dynamo compiled while a compiled Net trains ``steps`` steps (eager backend:
    no code generation), and its frame counters."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    frames: list[str] = []

    graphs: list[Any] = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        compiled(torch.randint(0, 16, (2, 4))).float().mean().backward()
        opt.step()
        opt.zero_grad()
    for gm in graphs:  # the code each graph came from: the frame dynamo compiled
        frames.append(next((str(n.meta.get("stack_trace", "")).strip().splitlines()[0]
                            for n in gm.graph.nodes if n.meta.get("stack_trace")), "?"))
    out = {**counters["frames"], "graphs": len(graphs)}, sorted(frames)
    torch._dynamo.reset()
    counters.clear()  # later tests' agents would take this process for a compiled job
    return out[1], out[0]


def test_dynamo_compiles_the_same_frames_with_the_tracer_on(make_agent):
    # GIVEN the frames a compiled model with graph breaks compiles without the agent
    alone_frames, alone = _compiled()
    assert alone_frames and all("trace_hot" not in f for f in alone_frames), alone_frames
    # WHEN it trains with the agent tracing every module on every step
    make_agent(trace="on")
    traced_frames, traced = _compiled()
    # THEN dynamo compiled the same frames, as often: none of them the agent's
    assert traced == alone, (traced, traced_frames, alone_frames)
    assert traced_frames == alone_frames


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 32)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(32, 32), nn.LayerNorm(32))
                                     for _ in range(3)])
        self.head = nn.Linear(32, 16)

    def forward(self, idx: Any) -> Any:
        x = self.emb(idx)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def test_ddp_split_graphs_are_named_by_the_modules_they_hold(tmp_path):
    """DDP + compile: dynamo splits the graph at the gradient buckets, and the parts run as
    modules the tracer sees (``compiled_submod_0 ...`` of a ``GraphModule``). They are named
    by the model's modules they hold, and the split says so."""
    import gc

    import torch._dynamo
    import torch.distributed as dist

    from probe_agent.collectors.tracer.trace_names import ModuleNames

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    first = dist._DEFAULT_FIRST_BUCKET_BYTES
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024  # buckets of a few KiB: a split in several parts
    try:
        torch._dynamo.reset()
        model = Plain()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)
        compiled = torch.compile(ddp, backend="eager")
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            compiled(torch.randint(0, 16, (2, 4))).float().mean().backward()
            opt.step()
            opt.zero_grad()
        split = next(o for o in gc.get_objects() if type(o).__name__ == "GraphModule"
                     and "partition_names" in getattr(o, "meta", {}))
        parts = [m for c, m in split._modules.items() if c.startswith("compiled_submod_")]
        names = ModuleNames(lambda: [opt])
        # WHEN the tracer names what it saw called: the split graph, its parts and the graph
        # each part runs (in the order of the calls)
        called = [split, *[x for p in parts for x in (p, p.submod.__self__)]]
        got = [names.name(m, compiled)[0] for m in called]
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first
        dist.destroy_process_group()
        torch._dynamo.reset()
    n = len(parts)
    # THEN no compiler-made name is left, and each part's graph lists the model's modules
    assert n >= 2 and not any("compiled_submod" in g or "GraphModule" in g for g in got), got
    assert got[0].startswith(f"compiled graph (split in {n} at DDP's buckets: emb, ")
    assert got[1::2] == [f"DDP bucket split {i}/{n}" for i in range(1, n + 1)], got
    real = {name for name, _ in model.named_modules()}
    held = [g.split(" (", 1)[1].rstrip(")").split(", ") for g in got[2::2]]
    assert all(g.startswith(f"compiled graph {i}/{n} (") for i, g in enumerate(got[2::2], 1))
    assert all(set(h) <= real for h in held), held
    assert {"emb", "head", "blocks.0", "blocks.2"} <= {x for h in held for x in h}, held
