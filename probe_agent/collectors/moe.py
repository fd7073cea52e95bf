"""MoeCounter: tokens per expert of every top-k router, per sampled step -> ``python.moe_load``.

Finding the routers (no code change)
------------------------------------
A module with a ``gate`` (or ``router``) child and an ``experts`` child is an MoE block when the
experts are an ``nn.ModuleList`` of 2 or more, or one fused module that says how many it holds
(``num_experts``/``num_local_experts``): HF Mixtral and Qwen-MoE (v5's fused experts and top-k
router, and the older ModuleList with a Linear gate), torchtitan's MoE (``router`` with
``experts``), and plain code written the same way. k is the block's or the gate's ``top_k``
(``num_experts_per_tok``, ``topk``, ``k``), else 1. Found with one heap walk (model_scan.py)
at the first sampled step, again at steps 10 and 100 (a model built late).

Counting what the router chose
------------------------------
A forward hook on the gate reads its output: the expert indices when the router returns them
(an integer tensor of last dimension k: v5 Mixtral's ``router_indices``, torchtitan's
``selected_experts_indices``), else the top k of its logits (a floating tensor whose last
dimension is the number of experts, as the block itself computes them). Counts accumulate on
the gate's device with ``index_add_`` (no host sync: ``bincount`` would sync on CUDA) and are
read on the writer thread, after the step.

Cost and safety
---------------
Hooks are put on the gates only for the sampled steps (the tracer's traced steps, every 10th
by default) and removed after, so other steps pay nothing; a sampled step pays one top-k and one
``index_add_`` per MoE layer (bench/bench_levers.py). Never while torch.compile has compiled
frames in the process: adding or removing a hook on a compiled module makes dynamo recompile
it. A failure is counted by a Guard; repeated failures switch the counter off.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

from . import Guard, Sink
from .moe_layout import expert_owners, global_experts
from .registry import CollectorSpec
from .row_buffer import RowBuffer
from .tracer.saved_bytes import compiled_here

if TYPE_CHECKING:
    from ..clock import StepClock

TABLE = "python.moe_load"
#: Steps at which the routers are looked for again (a heap walk each).
SCAN_STEPS = (10, 100)
K_NAMES = ("top_k", "num_experts_per_tok", "topk", "k", "router_top_k", "experts_per_token")
E_NAMES = ("num_experts", "num_local_experts", "n_experts", "n_routed_experts")
#: Sampled steps' counts kept between flushes.
BUFFER = 1000


def find_router(module: Any, module_list: Any) -> tuple[Any, int, int] | None:
    """(gate, experts, k) when ``module`` is a top-k MoE block, else None. ``experts`` is the
    layer's count over all ranks (an expert-parallel block holds only its local ones:
    moe_layout.global_experts)."""
    mods = module._modules
    gate = mods.get("gate") if mods.get("gate") is not None else mods.get("router")
    experts = mods.get("experts")
    if gate is None or experts is None:
        return None
    if isinstance(experts, module_list):
        n = len(experts)
    else:
        n = next((int(v) for a in E_NAMES if isinstance(v := getattr(experts, a, None), int)), 0)
    n = global_experts(module, gate, n) if n else n
    if n < 2:
        return None
    k = next((int(v) for obj in (module, gate) for a in K_NAMES
              if isinstance(v := getattr(obj, a, None), int) and not isinstance(v, bool)), 1)
    return gate, n, max(1, min(k, n))


def chosen_experts(torch: Any, out: Any, n: int, k: int) -> tuple[Any, bool] | None:
    """What a gate's output chose: (expert indices, False), or (tokens per expert, True) when
    it returns the counts themselves (DeepSpeed's TopKGate: ``exp_counts``, beside combine
    weights whose last dimension is the capacity), or None when it says nothing."""
    items = out if isinstance(out, (tuple, list)) else (out,)
    tensors = [t for t in items if isinstance(t, torch.Tensor)]
    for t in tensors:
        if not t.is_floating_point() and t.dtype != torch.bool and t.dim() >= 1 \
                and t.shape[-1] == k and not (t.dim() == 1 and t.numel() == n):
            return t, False
    for t in tensors:
        if not t.is_floating_point() and t.dtype != torch.bool and t.dim() == 1 \
                and t.numel() == n:
            return t, True
    for t in tensors:
        if t.is_floating_point() and t.dim() >= 1 and t.shape[-1] == n:
            return torch.topk(t.detach(), k, dim=-1).indices, False
    return None


class MoeCounter:
    """Collector for ``python.moe_load``; see the module docstring.

    Args:
        clock: the step clock (hooks go on and off at its boundaries).
        rank: written into every row.
        sampled: ``sampled(step)`` says whether step ``step`` is counted (the tracer's
            ``traced``; None: every 10th step).
    """

    def __init__(self, clock: StepClock, rank: int, sampled: Any = None) -> None:
        self.clock = clock
        self.rank = rank
        self.sampled = sampled or (lambda step: step % 10 == 0)
        self.guard = Guard("MoE counter")
        #: (layer, gate, experts, k, the global rank holding each expert or None: no EP)
        self.routers: list[tuple[str, Any, int, int, list[int] | None]] = []
        self.rows = RowBuffer(TABLE)  # python.moe_experts rows, flushed by the writer
        self.pending: list[tuple[int, float, list[tuple[str, Any, int, int, Any]]]] = []
        self._unsubscribe: Any = None
        self._handles: list[Any] = []
        self._acc: dict[str, Any] = {}
        self._scanned_at: int | None = None
        self._step: int | None = None  # the step whose counts the hooks gather
        self.skipped: str | None = None

    def start(self, sink: Sink) -> None:
        self.rows.start(sink)
        self._unsubscribe = self.clock.subscribe(self._on_step, "MoE counter")
        sink.add_flusher(self.flush)

    def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._unhook()
        self.flush()

    # -- training thread ---------------------------------------------------------------------
    def _on_step(self, step: int, optimizer: Any) -> None:
        torch = sys.modules.get("torch")
        if torch is None or not self.guard.enabled:
            self._unhook()
            return
        try:
            if self._handles:
                self._collect(step)
            if compiled_here():
                self.skipped = "torch.compile in the process"
                return
            if not self.sampled(step + 1):
                return
            if self._scanned_at is None or (step >= SCAN_STEPS[0] and self._scanned_at <
                                            SCAN_STEPS[0]) or (step >= SCAN_STEPS[1] and
                                                               self._scanned_at < SCAN_STEPS[1]):
                self._scan(torch, step)
            if self.routers:
                self._hook(torch, step + 1)
        except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
            self._unhook()
            self.guard.failed(e)

    def _scan(self, torch: Any, step: int) -> None:
        from .model_scan import ModelScan

        self._scanned_at = step
        scan = ModelScan(torch)
        found = []
        for m in scan.modules:
            got = find_router(m, torch.nn.ModuleList)
            if got is not None:
                gate, n, k = got
                owners = expert_owners(torch, m, m._modules["experts"], n)
                found.append((scan.name(m), gate, n, k, owners))
        self.routers = sorted(found, key=lambda r: r[0])

    def _hook(self, torch: Any, step: int) -> None:
        self._step = step
        self._acc = {}
        for layer, gate, n, k, _ in self.routers:
            self._handles.append(gate.register_forward_hook(self._counter(torch, layer, n, k)))

    def _counter(self, torch: Any, layer: str, n: int, k: int) -> Any:
        def count(_module: Any, _args: Any, out: Any) -> None:
            if not self.guard.enabled:
                return
            try:
                got = chosen_experts(torch, out, n, k)
                if got is None:
                    return
                flat = got[0].detach().reshape(-1).long()
                acc = self._acc.get(layer)
                if acc is None:
                    acc = self._acc[layer] = torch.zeros(n, dtype=torch.long, device=flat.device)
                if got[1]:  # the gate's own tokens per expert
                    acc.add_(flat)
                else:
                    acc.index_add_(0, flat.clamp(0, n - 1), torch.ones_like(flat))
            except Exception as e:  # noqa: BLE001 - training thread: counted, never raised
                self.guard.failed(e)

        return count

    def _collect(self, step: int) -> None:
        """The sampled step ended: hand its device counts to the writer thread."""
        acc, self._acc = self._acc, {}
        self._unhook()
        if acc and self._step == step and len(self.pending) < BUFFER:
            got = [(layer, acc[layer], n, k, owners) for layer, _, n, k, owners in self.routers
                   if layer in acc]
            self.pending.append((step, time.time(), got))

    def _unhook(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    # -- writer thread -----------------------------------------------------------------------
    def flush(self) -> None:
        n = len(self.pending)
        if n:
            batch, self.pending[:n] = self.pending[:n], []
            for step, t, layers in batch:
                for layer, counts, experts, k, owners in layers:
                    # .tolist() here, not on the training thread: on CUDA it waits for the
                    # step's kernels, which the writer may do
                    for expert, tokens in enumerate(counts.tolist()):
                        self.rows.add((t, self.rank, step, layer, expert, int(tokens),
                                       experts, k, owners[expert] if owners else None))
        self.rows.flush()

    def state(self) -> dict[str, Any]:
        return {"routers": [(r[0], r[2], r[3]) for r in self.routers],
                "expert_parallel": [r[0] for r in self.routers if r[4]], "skipped": self.skipped,
                "failures": self.guard.failures, "disabled": not self.guard.enabled}


def _sampled(tracer: Any) -> Any:
    """The tracer's traced steps (None without a tracer: every 10th step)."""
    return tracer.traced if tracer is not None else None


#: The collector of this module, for registry.py.
COLLECTOR = CollectorSpec("moe", 87, needs=("tracer",), tables=(TABLE,),
                          build=lambda b: MoeCounter(b.clock, b.rank, _sampled(b.get("tracer"))))
