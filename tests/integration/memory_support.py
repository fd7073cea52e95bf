"""Models and an independent counter of saved activations for the memory tests (issue 29)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


class WideAttn(nn.Module):
    """Attention-like: saves (B, H, T, T) scores and probabilities, far more than the rest."""

    def __init__(self, d: int, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.heads) ** 0.5)
        att = F.softmax(att, dim=-1)
        return (att @ v).transpose(1, 2).reshape(b, t, c)


class AttnHeavy(nn.Module):
    """An embedding, a small MLP, the attention-like block, a head."""

    def __init__(self, vocab: int = 64, d: int = 32, ctx: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.attn = WideAttn(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        x = x + self.mlp(x)
        x = x + self.attn(x)
        logits = self.head(x)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def run(capsys: Any, agent: Any, *argv: str) -> tuple[int, str, str]:
    """The real CLI (``probe_cli.main``) against ``agent``: exit code, stdout, stderr."""
    from probe_cli.main import main

    code = main([agent.url.removeprefix("http://"), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def steps(model: nn.Module, opt: torch.optim.Optimizer, n: int, batch: Any = None) -> None:
    """``n`` steps of ``model`` (returning its loss) on one batch, gradients cleared after."""
    idx, tgt = batch if batch is not None else tokens()
    for _ in range(n):
        model(idx, tgt).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def tokens(b: int = 16, ctx: int = 128, vocab: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(0, vocab, (b, ctx), generator=g),
            torch.randint(0, vocab, (b, ctx), generator=g))


class HarnessCounter:
    """The test's own count: a saved_tensors_hooks pair and forward pre/post hooks on every
    module; each storage saved counts once per pass, for the innermost module running, leaving
    out parameters' storages."""

    def __init__(self, model: nn.Module) -> None:
        self.names = {m: (n or type(model).__name__) for n, m in model.named_modules()}
        self.params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.stack: list[str] = []
        self.seen: set[int] = set()
        self.by_module: dict[str, int] = {}
        self.handles: list[Any] = []
        for m in self.names:
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))

    def _pre(self, m: nn.Module, args: Any) -> None:
        self.stack.append(self.names[m])

    def _post(self, m: nn.Module, args: Any, out: Any) -> None:
        self.stack.pop()

    def _count(self, t: torch.Tensor) -> None:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if self.stack and ptr not in self.seen and ptr not in self.params:
            self.seen.add(ptr)
            mod = self.stack[-1]
            self.by_module[mod] = self.by_module.get(mod, 0) + s.nbytes()

    def reset(self) -> None:
        self.seen.clear()
        self.by_module = {}

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        """Count inside one step (enter after the optimizer step, leave before the next): the
        agent pushes its own hooks at the boundary, and only the innermost hooks run, so these
        count and then hand the tensor to the agent's (a context spanning the boundary would
        keep the agent from counting at all)."""
        top = torch._C._autograd._top_saved_tensors_default_hooks(True)
        below = top if top is not None and top[0] is not None else None

        def pack(t: torch.Tensor) -> Any:
            self._count(t)
            return below[0](t) if below is not None else t.detach()

        with torch.autograd.graph.saved_tensors_hooks(
                pack, below[1] if below is not None else (lambda x: x)):
            yield
