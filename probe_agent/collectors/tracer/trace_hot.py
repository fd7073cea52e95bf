"""The tracer's hot path: the ``nn.Module.__call__`` wrapper and the backward pre-hook.

Everything here runs on the training thread once per module call or backward node, so every
line is paid ~100 times a step; ``TorchTracer`` (tracer.py) owns the per-call state and binds
it here (``bind``); the records go into its ``Records`` (records.py). What it records and why:
tracer.py; the record formats: trace_columns.py.

Costs measured on this 2-core VM with ``timeit`` (warm caches):
``torch.compiler.is_compiling()`` 116 ns, ``perf_counter_ns`` 83 ns,
``tensor.grad_fn`` 125 ns, ``Node.register_prehook`` ~1.7 us through torch's own
``Function._register_hook`` (an OrderedDict, a ``RemovableHandle`` and its weakref per node)
and ~0.7 us through ours (``_register_hook``). Between a model's kernels caches are cold and
each costs 2-3x that, which is why the wrapper does as little as it can.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ... import patches
from .trace_columns import BW_MAX, FORWARD, FW_MAX, PASS_END, RECOMPUTE, pack_bw, pack_fw

if TYPE_CHECKING:
    from .tracer import TorchTracer

#: The key of the tracer's pre-hook in a node's hook dict. torch's RemovableHandle ids count up
#: from 0, so a user's hook on the same node never collides with it (or removes it).
_HOOK_KEY = -1

# Module globals are the cheapest reads in Python; ``bind`` sets them.
_tracer: TorchTracer | None = None  # the active tracer, or None: the wrapper passes through
_orig_call: Any = None  # nn.Module.__call__ as found (torch's, or someone's wrapper of it)
_direct = False  # _orig_call is torch's _wrapped_call_impl: call self._call_impl directly
_is_compiling: Any = None
_Tensor: Any = None
_current_node: Any = None  # torch._C._current_autograd_node
_Function: Any = None  # torch.autograd.Function, whose _register_hook we stand in for
_torch_register_hook: Any = None  # the function it stands in for, which gets every other hook
_call_patch: Any = None  # the ledger's record of our nn.Module.__call__ (patches.py)
_hook_patch: Any = None  # ... and of our Function._register_hook
_clock: Any = None
_native: Any = None  # the C++ hot path while bound to it (trace_native.py), else None
_native_call_c: Any = None  # its ``call``
_on_input: Any = None  # SavedBytes._on_input while saved bytes are counted (set_inputs), else None


def bind(tracer: TorchTracer, torch: Any) -> None:
    """Make ``tracer`` the one the hot path records into (``arm``)."""
    global _tracer, _orig_call, _direct, _is_compiling, _Tensor, _current_node, _clock
    global _Function
    if _orig_call is None:
        _orig_call = torch.nn.Module.__call__
        _direct = _orig_call is torch.nn.Module._wrapped_call_impl
    _is_compiling = torch.compiler.is_compiling
    _Tensor = torch.Tensor
    _current_node = torch._C._current_autograd_node
    _clock = tracer.clock
    _Function = torch.autograd.Function
    _tracer = tracer


def unbind(tracer: TorchTracer) -> None:
    """The hot path stops recording into ``tracer`` at once (``stop``, or too many failures);
    ``uninstall`` at the next step boundary puts torch back."""
    global _tracer
    if _tracer is tracer:
        _tracer = None
        if _native is not None:
            _native.unbind()


def bind_native(tracer: TorchTracer, native: Any) -> None:
    """Make the C++ hot path (``trace_native``) record into ``tracer``'s step (``bind`` first);
    ``install(torch, native=True)`` then puts it in place."""
    global _native, _native_call_c
    native.bind(tracer, _orig_call, _direct, FW_MAX, BW_MAX)
    native.inputs(_on_input)
    _native, _native_call_c = native, native.call


def set_inputs(fn: Any, was: Any = None) -> None:
    """``fn(module, args)`` is called inside every traced call's span, on both paths (the
    saved-bytes accounting's input record); ``set_inputs(None, fn)`` removes ``fn`` unless
    another tracer's has replaced it since."""
    global _on_input
    if fn is None and _on_input != was:
        return
    _on_input = fn
    if _native is not None:
        _native.inputs(fn)


def install(torch: Any, native: bool = False) -> None:
    """Wrap ``nn.Module.__call__`` and, on the Python path, stand in for
    ``Function._register_hook``; on the native path add its backward callback instead (``bind``,
    and ``bind_native``, first). Only while steps are traced: with tracing off torch stays as
    it was. Both go through the patch ledger (patches.py)."""
    global _call_patch, _hook_patch, _torch_register_hook
    call = native_call if native else traced_call
    if torch.nn.Module.__call__ is not call:
        if torch.nn.Module.__call__ in (traced_call, native_call):
            uninstall(torch)
        _call_patch = patches.replace(
            torch.nn.Module, "__call__", call, by="tracer",
            why="times every module call on traced steps (python.torch_trace)")
    if native:
        _native.backward(True)
    elif _Function.__dict__.get("_register_hook") is not _REGISTER:
        # torch's is inherited (from _HookMixin): restoring deletes ours rather than copy it in
        _torch_register_hook = _Function._register_hook
        _hook_patch = patches.replace(
            _Function, "_register_hook", _REGISTER, by="tracer",
            why="adds the tracer's backward pre-hook to a node without a RemovableHandle")


def uninstall(torch: Any) -> None:
    """Undo ``install``, except what someone replaced since: a wrapper of our wrapper stays
    (``recording``/``unbind`` turn it off), and so does their own ``_register_hook``."""
    global _call_patch, _hook_patch
    if torch.nn.Module.__call__ in (traced_call, native_call) and patches.restore(_call_patch):
        _call_patch = None
    if _native is not None:
        _native.backward(False)
    if _Function is not None and patches.restore(_hook_patch):
        _hook_patch = None


def skip_in_dynamo(own: tuple[Any, ...] = ()) -> bool:
    """Tell dynamo never to compile the wrappers, nor the agent code they call (``own``), as
    frames of their own; True once done (or when this torch has no such switch). Called once
    ``torch._dynamo`` is imported.

    Dynamo compiles every Python frame it meets outside a graph: the frame a compiled module
    starts in (``torch.compile`` binds ``module.__call__``, the wrapper while it is installed)
    and each frame called after a graph break. Our one code object for every module's call
    then collected a cache entry per module type and argument count (guards on ``type(self)``
    and ``len(args)``): 14-16 recompiles where the job alone had 4, steps of 3 s, then the
    cache limit; and the tracer's ``on_root`` was compiled too. Skipped, dynamo runs the
    wrappers as plain Python and compiles the frames they call (the job's forwards), as it
    would without them; the agent's own code (``own``) is skipped with everything it calls.
    Traced inside a graph the wrapper is still inlined, and ``is_compiling()`` folds it to
    the original call.
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is None:
        return False
    try:
        strategy, action = eval_frame.FrameExecStrategy, eval_frame.FrameAction
        for fn in (traced_call, native_call):
            eval_frame.set_code_exec_strategy(
                fn.__code__, strategy(action.SKIP, action.DEFAULT))
        for fn in (on_backward, backward_done, _register_hook, *own):
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if code is not None:
                eval_frame.set_code_exec_strategy(code, strategy(action.SKIP, action.SKIP))
    except (AttributeError, TypeError):
        return True  # a torch without per-code strategies: nothing to tell it
    if any(x.name == "torch._dynamo code strategies" for x in patches.settings()):
        return True  # recorded by an earlier tracer of this process
    patches.setting("torch._dynamo code strategies", "SKIP for the tracer's wrappers and hooks",
                    by="tracer", why="dynamo never compiles the agent's frames (they gathered "
                    "a cache entry per module type: recompiles, then the cache limit)",
                    restorable=False, why_kept="dynamo has no way to unset a code's strategy; "
                    "it only concerns the agent's own code objects")
    return True


def traced_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Replaces ``nn.Module.__call__`` during traced steps. Must never raise on its own."""
    if _is_compiling():  # dynamo folds this to True: nothing below is traced into a graph
        return _orig_call(self, *args, **kwargs)
    tr = _tracer
    if tr is None:
        return _orig_call(self, *args, **kwargs)
    depth = tr.depth
    if depth == 0:
        tr.on_root(self, args, kwargs)
    if not tr.recording:
        tr.depth = depth + 1
        try:
            return _orig_call(self, *args, **kwargs)
        finally:
            tr.depth = depth
    rec = tr.records
    e0 = rec.record_event() if tr.cuda else None
    # the input's grad_fn, read before the call (an in-place module replaces it): autograd
    # reaching it ends this call's backward. Most inputs are the output of the module called
    # just before (``last_gf``), whose node is hooked already.
    a = args[0] if args else next(iter(kwargs.values()), None) if kwargs else None
    igf = None
    if isinstance(a, _Tensor):
        try:
            igf = a.grad_fn
        except Exception as e:  # noqa: BLE001 - a tensor subclass's getter: no end event
            tr.failed(e)
    new_igf = igf is not None and igf is not tr.last_gf
    tr.depth = depth + 1
    t0 = _clock()
    if _on_input is not None:  # inside the span: the inputs are this call's (never raises)
        _on_input(self, args)
    try:
        # torch's __call__ is one more frame that only picks the compiled or the plain call
        if _direct and self._compiled_call_impl is None:
            out = self._call_impl(*args, **kwargs)
        else:
            out = _orig_call(self, *args, **kwargs)
    finally:
        t1 = _clock()
        tr.depth = depth
    try:
        # the record's CUDA field: 0 (none), the events until queued, then 1 (queued in fcuda)
        cuda: tuple[Any, Any, Any] | int = 0
        if e0 is not None:
            cuda = (e0, rec.record_event(), rec.memory())
        gseq = igseq = -1
        if igf is not None:
            igseq = igf._sequence_nr()
            if new_igf:
                tr.hook_gfs.append(igf)
        o = out
        if type(o) is not _Tensor:
            if type(o) in (tuple, list) and o:
                o = o[0]
            elif isinstance(o, dict) and o:  # ModelOutput and friends: the first value
                o = next(iter(o.values()))
            if not isinstance(o, _Tensor):
                o = None
        if o is not None:
            gf = o.grad_fn
            if gf is not None:
                gseq = gf._sequence_nr()
                if gf is not tr.last_gf:  # a Sequential and its last layer share one
                    tr.hook_gfs.append(gf)
                    tr.last_gf = gf
        fw = rec.fw
        if len(fw) < FW_MAX:
            # objects first, record last: the writer takes as many objects as records
            rec.objs.append(self)
            rec.roots.append(tr.root)
            if cuda:
                rec.fcuda.append(cuda)
                cuda = 1
            fw.frombytes(pack_fw(t0, t1, tr.step, tr.in_backward, depth, gseq, cuda, igseq))
        else:
            rec.dropped += 1
        if depth < 2:
            # Pre-hooks are registered in a batch when a top-level module returns: one costs
            # ~3x more between the model's kernels than in a loop of them. Backward cannot
            # reach these grad_fns before then, unless a module runs backward inside its own
            # forward below depth 1 (those calls get no backward rows).
            gfs = tr.hook_gfs
            if gfs:
                for gf in gfs:
                    gf.register_prehook(on_backward)
                gfs.clear()
    except Exception as e:  # noqa: BLE001 - the one sanctioned broad except: never into training
        tr.failed(e)
    return out


def native_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    """Replaces ``nn.Module.__call__`` during traced steps on the native path: the C++ hot path
    (``trace_native.cpp``) does ``traced_call``'s work. This frame stays in Python for dynamo,
    which must see ``is_compiling()`` to trace torch's own ``__call__`` instead."""
    if _is_compiling():
        return _orig_call(self, *args, **kwargs)
    return _native_call_c(self, args, kwargs)


def on_backward(grad_outputs: Any) -> None:
    """The pre-hook of every hooked grad_fn: the backward of the forward calls whose output had
    the running node as ``grad_fn`` starts now. The event names the node by its sequence
    number, which the forward records carry (``gseq``): nothing per node but torch's dict."""
    tr = _tracer
    if tr is None:
        return  # a node hooked before the tracer stopped
    try:
        node = _current_node()
        rec = tr.records
        bw = rec.bw
        if node is not None and len(bw) < BW_MAX:
            if tr.cuda:
                rec.record_bw_cuda(node._sequence_nr(), memory=True)
            else:
                bw.frombytes(pack_bw(_clock(), node._sequence_nr(), 0))
        if not tr.in_backward:
            tr.in_backward = RECOMPUTE  # an int: the writer reads rows' kinds as int8
            tr.queue_callback(backward_done)
    except Exception as e:  # noqa: BLE001 - inside autograd: never raise
        tr.failed(e)


def backward_done() -> None:
    """Autograd queue callback: the backward pass that ``on_backward`` saw start has ended."""
    tr = _tracer
    if tr is None:
        return
    try:
        if tr.cuda:
            tr.records.record_bw_cuda(PASS_END, memory=False)
        else:
            tr.records.bw.frombytes(pack_bw(_clock(), PASS_END, 0))
    except Exception as e:  # noqa: BLE001 - an autograd queue callback: never raise
        tr.failed(e)
    finally:
        tr.in_backward = FORWARD


def _register_hook(hooks: Any, hook: Any) -> tuple[Any, Any]:
    """Stands in for ``torch.autograd.Function._register_hook``, which ``Node.register_prehook``
    calls from C++ to get the node's hook dict and a handle. For ``on_backward`` it skips the
    ``RemovableHandle`` (nothing ever removes the tracer's hook: the graph dies with its step)
    and returns ``None`` for it; a second registration on one node replaces the first, so a
    node never reports twice. Every other hook goes to torch's own function."""
    if hook is not on_backward:
        return _torch_register_hook(hooks, hook)
    if hooks is None:
        hooks = OrderedDict()  # torch's type: a later user hook takes a weakref to it
    hooks[_HOOK_KEY] = hook
    return hooks, None


_REGISTER = staticmethod(_register_hook)


def _after_fork_in_child() -> None:
    # NOTE: a forked child (DataLoader worker) has no writer thread: record nothing there, on
    # either path (the C++ one's backward callback would keep recording into its buffer).
    global _tracer, _on_input
    _tracer = _on_input = None
    if _native is not None:
        _native.unbind()
        _native.backward(False)
        _native.inputs(None)


os.register_at_fork(after_in_child=_after_fork_in_child)
patches.setting("os.register_at_fork(after_in_child)", "trace_hot._after_fork_in_child",
                by="tracer", why="a forked child (DataLoader worker) records nothing",
                restorable=False, why_kept="os.register_at_fork has no unregister; it only "
                "clears the tracer's globals in the child")
