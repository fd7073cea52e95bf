"""The tracer's record formats (training thread -> writer) and ``python.torch_trace``'s schema.

The training thread writes plain numbers into ``array('q')`` buffers, one fixed-size record per
module call (``FW_*`` slots) and per backward event (``BW_*`` slots). Numbers in an array are
not Python objects: a traced step allocates nothing the garbage collector tracks, where a tuple
per row made the collector run a generation-0 pass every step, and every pass moved whatever
the training step had alive at that moment (its tensors included) towards the old generation,
until a full collection of the whole process ran: ~160 ms under the GIL every ~375 steps,
measured here, 0.43 ms per step. The writer hands the buffers to Arrow without copying them
(``records``) and resolves them in SQL (``trace_rows.py``).
"""

from __future__ import annotations

import struct
from array import array

import pyarrow as pa

#: Forward records (and backward events) buffered between two writer resolves; beyond it rows
#: are dropped and counted (``dropped``). 200k rows = 11 MB of records; at 100 modules, 2000
#: traced steps.
BUFFER_ROWS = 200_000

# Row kinds as the training thread records them, and BACKWARD for resolved rows.
FORWARD, RECOMPUTE, OPT_STEP, BACKWARD = range(4)

# Forward record: one per module call or optimizer step.
#   gseq: sequence number of the output's grad_fn (-1: none), which backward events carry.
#   cuda: 1 if the call's CUDA events went to the tracer's ``fcuda`` list (in record order).
#   igseq: sequence number of the grad_fn of the call's input (its first tensor argument, read
#     before the call; -1: none): autograd reaching that node ends the call's backward.
FW_T0, FW_T1, FW_STEP, FW_KIND, FW_DEPTH, FW_GSEQ, FW_CUDA, FW_IGSEQ = range(8)
FW_N = 8
# Backward event: a grad_fn pre-hook fired (gseq of its node), or a pass ended (gseq -1).
BW_T, BW_GSEQ, BW_CUDA = range(3)
BW_N = 3
PASS_END = -1
#: Steps of forward records a backward event may still name (older calls get no backward row):
#: the resolver keeps their rows, the C++ hot path the names of their nodes.
KEEP_STEPS = 3
# Buffer lengths (numbers, not records) beyond which the training thread drops records.
FW_MAX = BUFFER_ROWS * FW_N
BW_MAX = BUFFER_ROWS * BW_N
# One record as bytes, for ``buffer.frombytes``: 240 ns a record where ``buffer.extend(tuple)``
# takes 570 ns (it resizes the array once per number), measured on this VM.
pack_fw = struct.Struct(f"{FW_N}q").pack
pack_bw = struct.Struct(f"{BW_N}q").pack

def records(buf: array, width: int) -> pa.FixedSizeListArray:
    """``buf`` (flat int64 records of ``width`` numbers) as Arrow, without a copy. ``buf`` must
    not grow while Arrow holds it: pass the writer's own slice, never a live buffer."""
    flat = pa.Array.from_buffers(pa.int64(), len(buf), [None, pa.py_buffer(buf)])
    return pa.FixedSizeListArray.from_arrays(flat, width)
