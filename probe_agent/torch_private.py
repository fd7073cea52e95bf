"""Every private torch name the agent reads, with the torch versions it was checked on (pystack's
``version.cpp``: every version-dependent layout in one table).

A private name can move or vanish in any torch release. Each row says where it lives, who reads
it and what the reader does when it is missing; ``tests/unit/test_torch_private.py`` resolves
every row against the installed torch, so an upgrade that moves one fails there, by name,
instead of as a collector that quietly switched itself off. When you read a new private name,
add its row (and the torch version you checked it on); when a release moves one, the test
names it.

``owner`` is a module path, optionally ``module:Class``; ``name`` is dotted below it. ``on``:
``"module"`` (an attribute of the module or class: a slot or property counts), ``"instance"``
(set on instances by ``__init__`` or the first use: the test builds one), ``"cuda"`` (exists
only in CUDA builds).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The torch versions every row was checked on (the test checks the installed one).
CHECKED = ("2.13.0",)


@dataclass(frozen=True, slots=True)
class Private:
    owner: str
    name: str
    used_by: str
    missing: str  # what the reader does without it
    on: str = "module"
    checked: tuple[str, ...] = CHECKED

    @property
    def dotted(self) -> str:
        return f"{self.owner.replace(':', '.')}.{self.name}"


TABLE: tuple[Private, ...] = (
    # the tracer's hot path (collectors/tracer/)
    Private("torch.nn:Module", "_wrapped_call_impl", "trace_hot.bind",
            "calls through Module.__call__ (one frame more per call)"),
    Private("torch._C", "_current_autograd_node", "trace_hot (backward spans)",
            "the tracer does not start (collector off, one warning)"),
    Private("torch.autograd:Function", "_register_hook", "trace_hot (stands in for it)",
            "the tracer does not start"),
    Private("torch._dynamo.eval_frame", "set_code_exec_strategy", "trace_hot.skip_in_dynamo",
            "dynamo compiles the wrappers (recompiles under torch.compile)"),
    Private("torch._dynamo.eval_frame", "FrameExecStrategy", "trace_hot.skip_in_dynamo",
            "dynamo compiles the wrappers (recompiles under torch.compile)"),
    Private("torch._dynamo.eval_frame", "FrameAction.SKIP", "trace_hot.skip_in_dynamo",
            "dynamo compiles the wrappers (recompiles under torch.compile)"),
    Private("torch._C._dynamo.eval_frame", "set_code_exec_strategy",
            "host_syncs._skip_in_dynamo",
            "dynamo compiles the host-sync stand-ins (one more frame and break at each)"),
    Private("torch._C._dynamo.eval_frame", "_FrameExecStrategy", "host_syncs._skip_in_dynamo",
            "dynamo compiles the host-sync stand-ins (one more frame and break at each)"),
    Private("torch._C._dynamo.eval_frame", "_FrameAction.SKIP", "host_syncs._skip_in_dynamo",
            "dynamo compiles the host-sync stand-ins (one more frame and break at each)"),
    Private("torch._dynamo.utils", "get_compilation_metrics", "compile_state (recompiles)",
            "recompiles stay 0 in python.compile_state"),
    Private("torch._dynamo.utils", "counters", "compile_state",
            "python.compile_state says dynamo is not in use"),
    Private("torch.autograd.graph:Node", "_sequence_nr", "trace_hot (backward node order)",
            "backward rows are not matched to forward calls", on="instance"),
    Private("torch.autograd.variable:Variable", "_execution_engine.queue_callback",
            "tracer (end of backward)", "backward end is taken at the optimizer step"),
    Private("torch._C._autograd", "_push_saved_tensors_default_hooks",
            "tracer/saved_bytes.py", "saved bytes are not counted"),
    Private("torch._C._autograd", "_pop_saved_tensors_default_hooks",
            "tracer/saved_bytes.py", "saved bytes are not counted"),
    Private("torch._C._autograd", "_top_saved_tensors_default_hooks",
            "tracer/saved_bytes.py", "saved bytes are not counted"),
    Private("torch.distributed.tensor:DTensor", "_local_tensor",
            "saved_bytes.py, memory_kinds.py (a shard's bytes)",
            "a DTensor counts as its global size"),
    # the step clock and optimizer hooks
    Private("torch.optim.optimizer", "_global_optimizer_pre_hooks", "optim_hooks.register",
            "no step clock: step-boundary actions refuse (409 no-step-hook)"),
    Private("torch.optim.optimizer", "_global_optimizer_post_hooks", "optim_hooks.register",
            "no step clock: step-boundary actions refuse (409 no-step-hook)"),
    Private("torch", "_foreach_norm", "trainloop (gradient check), numerics, module_stats",
            "gradient norms are not recorded (counted failure)"),
    Private("torch", "_foreach_sub", "module_stats (update/weight ratio)",
            "update ratios are not recorded"),
    # the loop monitor
    Private("torch.utils.data.dataloader", "_BaseDataLoaderIter.__next__",
            "trainloop (DataLoader wait)", "no DataLoader wait share"),
    Private("torch.utils.data.dataloader", "_BaseDataLoaderIter._next_index",
            "numerics (a batch's sample indices)", "NaN origins name no samples"),
    Private("torch.nn.utils.clip_grad", "_clip_grads_with_norm_", "trainloop (clipping)",
            "doctor's clipping check says not recorded"),
    Private("torch.amp.grad_scaler:GradScaler", "_scale", "trainloop.pending_scale",
            "a clip of scaled gradients is not told apart", on="instance"),
    Private("torch.amp.grad_scaler:GradScaler", "_enabled", "trainloop.pending_scale",
            "a clip of scaled gradients is not told apart", on="instance"),
    Private("torch.amp.grad_scaler:GradScaler", "_per_optimizer_states",
            "trainloop.pending_scale", "a clip of scaled gradients is not told apart",
            on="instance"),
    # LR schedules (collectors/schedule_read.py, actions/lr.py)
    Private("torch.optim.lr_scheduler:LRScheduler", "_last_lr", "actions/lr.py",
            "an LR change leaves get_last_lr() stale", on="instance"),
    Private("torch.optim.lr_scheduler:LRScheduler", "_step_count", "actions/lr_holds.py",
            "the next-step check of an LR change is skipped", on="instance"),
    Private("torch.optim.lr_scheduler:SequentialLR", "_schedulers", "schedule_read, playbook",
            "a sequential schedule reads as opaque", on="instance"),
    Private("torch.optim.lr_scheduler:SequentialLR", "_milestones", "schedule_read",
            "a sequential schedule reads as opaque", on="instance"),
    Private("torch.optim.lr_scheduler:OneCycleLR", "_schedule_phases", "schedule_read",
            "a one-cycle schedule reads as opaque", on="instance"),
    # collectives
    Private("torch.distributed.distributed_c10d", "_get_default_group", "collectives",
            "collective rows carry no group sequence number"),
    Private("torch.distributed.distributed_c10d", "_world", "collectives (group names)",
            "groups are named by their ranks only"),
    Private("torch.distributed.distributed_c10d", "_get_default_store",
            "agreement.py, postmortem/launch.py, ranks.py",
            "no rank discovery through the job's store (-t per rank still works)"),
    Private("torch.distributed:ProcessGroup", "_get_sequence_number_for_group", "collectives",
            "collective rows carry no sequence number"),
    Private("torch.distributed:PrefixStore", "_underlying_non_prefix_store",
            "agreement.py, ranks.py", "the store is used with its prefix"),
    Private("torch._C._distributed_c10d", "_dump_fr_trace", "collectives (Flight Recorder)",
            "DDP's C++ all-reduces are not seen"),
    Private("torch.distributed.device_mesh:DeviceMesh", "_root_mesh", "parallel",
            "a sub-mesh is reported as its own root"),
    # eval guard (FSDP2)
    Private("torch.distributed.fsdp._fully_shard._fsdp_param_group", "FSDPParamGroup._to_sharded",
            "eval_guard", "an immediate eval's mid-step reshard is not refused"),
    Private("torch.distributed.fsdp._fully_shard._fsdp_param_group",
            "FSDPParamGroup._to_unsharded", "eval_guard",
            "an immediate eval's mid-step reshard is not refused"),
    Private("torch.distributed.fsdp._fully_shard._fsdp_param_group",
            "FSDPParamGroup._to_sharded_post_forward", "eval_guard",
            "an immediate eval's mid-step reshard is not refused"),
    # profiling and memory
    Private("torch.autograd", "_profiler_enabled", "profiling/sessions.py",
            "a profiler the job runs itself is not detected"),
    Private("torch.autograd.profiler", "_is_profiler_enabled", "profiling/sessions.py",
            "a profiler the job runs itself is not detected"),
    Private("torch.utils._python_dispatch", "_get_current_dispatch_mode", "flops",
            "the FLOP meter does not start"),
    Private("torch.utils._python_dispatch", "TorchDispatchMode", "nan_hunt",
            "a NaN's origin is not re-run"),
    Private("torch.cuda.memory", "_snapshot", "cuda_history, oom", "no allocator history"),
    Private("torch.cuda.memory", "_record_memory_history", "cuda_history",
            "no allocator history"),
    Private("torch._C", "_cuda_memoryStats", "tracer/records.py (CUDA memory)",
            "CUDA memory columns stay 0", on="cuda"),
    Private("torch._C", "_cuda_attach_out_of_memory_observer", "oom",
            "an OOM is recorded from the exception only", on="cuda"),
    Private("torch._dynamo.eval_frame:OptimizedModule", "_orig_mod", "frameworks, module_stats",
            "a compiled model's modules are named under _orig_mod", on="instance"),
    # the model found on the heap (model_scan.py): each module's children, read directly (no
    # named_modules() walk, which a module may override); also tensors.py (model roots)
    Private("torch.nn:Module", "_modules", "model_scan, moe.find_router, tensors",
            "no MoE router and no compiled submodule is found (a counted failure; the "
            "collectors switch themselves off after repeated ones)", on="instance"),
)
