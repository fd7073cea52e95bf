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
