"""The torch tracer: forward, backward and optimizer-step time of every ``nn.Module``
into ``python.torch_trace``. One name for one thing: the tracer (``TorchTracer``, the
collector ``tracer``) writes the table ``torch_trace``, which ``PROBE_TRACE``, ``probe trace``
and ``/v1/trace`` switch.

- tracer.py: ``TorchTracer``, the collector: arming on torch's import, modes, the per-call state;
- records.py: ``Records``, the record buffers the hot paths fill and the writer takes (and the
  CUDA events beside them);
- trace_steps.py: ``StepBoundaries``: the optimizer step's row, the next step's set-up;
- trace_hot.py: the per-call Python hot path; trace_native.py with trace_native.cpp and
  trace_native_backward.cpp: the C++ one, built on first use (native_build.py: the builder
  process; native_ahead.py: `probe build-native`);
- trace_columns.py: the record formats; trace_flush.py: ``Writer``, when and how the writer
  resolves them; trace_rows.py, trace_names.py: records to rows.
"""
