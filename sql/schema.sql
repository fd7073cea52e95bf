-- schema.sql: every table the probe agent writes. The only DDL in the project.
--
-- Conventions: every table carries `rank`, so results from many ranks concatenate; the tables
-- that grow with training carry `step`, and retention (PROBE_RETENTION_MB) drops their oldest
-- steps first: python.steps, torch_trace, memory, metrics and step_stats, named in
-- probe_agent/store/retention.py (STEP_TABLES); every other table is kept whole. Timestamps are seconds since the Unix epoch (DOUBLE). Unqualified names resolve:
-- queries run with search_path = python,main.

CREATE SCHEMA IF NOT EXISTS python;

-- python.backtrace: one row per frame of the TRAINING thread (the thread that steps the
-- optimizer; the main thread before the first step), materialised when a query names it (the
-- snapshot is taken at the start of that query). depth 0 = innermost frame. So
-- `SELECT func, file, lineno, depth FROM python.backtrace ORDER BY depth LIMIT 10` is where
-- training is, never interleaved with another thread (tqdm's monitor, a DataLoader pin thread).
-- Other threads: python.backtrace_all, the sibling table below (same columns, every thread;
-- filter on thread_name). The agent's own threads (probe-agent.*) are left out of both, and
-- its frames (the tracer's native_call around each module call, its wrappers) are left out of
-- the user's threads (depth counts the frames shown). locals is NULL unless asked for by
-- the /v1/backtrace route; in SQL it is always NULL (reprs run user code, so only on request).
CREATE TABLE IF NOT EXISTS python.backtrace (
    rank        INTEGER NOT NULL,
    thread_id   BIGINT  NOT NULL,
    thread_name VARCHAR,
    is_main     BOOLEAN,
    depth       INTEGER NOT NULL,
    func        VARCHAR,
    file        VARCHAR,
    lineno      INTEGER,
    frame_type  VARCHAR,   -- 'Python' | 'Native'
    locals      VARCHAR    -- JSON text: name -> truncated repr
);
-- python.backtrace_all: python.backtrace's columns, one row per frame of every thread but the
-- agent's, e.g. `SELECT thread_name, func, file, lineno FROM python.backtrace_all
-- WHERE thread_name <> 'MainThread' ORDER BY thread_id, depth`.
CREATE TABLE IF NOT EXISTS python.backtrace_all (
    rank        INTEGER NOT NULL,
    thread_id   BIGINT  NOT NULL,
    thread_name VARCHAR,
    is_main     BOOLEAN,
    depth       INTEGER NOT NULL,
    func        VARCHAR,
    file        VARCHAR,
    lineno      INTEGER,
    frame_type  VARCHAR,
    locals      VARCHAR
);

-- python.evals: one row per /v1/eval request (probe eval without a step flag), as it ended.
-- code is stored as sent; outcome is 'ok' | 'error' | 'timeout' | 'refused'. The same row is
-- in python.audit (kind 'eval'), with every other request of the rank.
CREATE TABLE IF NOT EXISTS python.evals (
    timestamp   DOUBLE  NOT NULL,
    rank        INTEGER NOT NULL,
    client      VARCHAR,          -- peer address, or 'unix:uid=N'
    code        VARCHAR NOT NULL,
    outcome     VARCHAR NOT NULL,
    error       VARCHAR,
    elapsed_ms  DOUBLE
);

-- python.audit: the audit log: who asked this rank to do what, and what became of it. Kept
-- whole (retention trims only the step tables). Written by probe_agent/audit.py.
-- kind:
--   'eval': a /v1/eval (also in python.evals); outcome 'ok' | 'error' | 'timeout' | 'refused',
--     or 'replayed': the same code under an id that had run already (a retry after a 504),
--     answered with that eval's outcome without running it again.
--   a step-boundary action (probe_agent/actions/): 'step-eval' (eval --at-step/--next-step),
--     'lr', 'checkpoint', 'pause', 'resume', 'cancel'. One action writes several rows as it
--     moves on: outcome 'queued' (accepted), 'refused' (not accepted: no optimizer step seen,
--     step already passed, ...), 'overrun' (still running past PROBE_ACTION_TIMEOUT_S), then
--     exactly one of 'ok' | 'error' | 'cancelled' | 'skipped' (not every rank reached the step
--     in time, so it ran nowhere).
--   'profile' (`probe profile`, a step-boundary action): queued, ok = the profiler started at
--     at_step, refused, error; then one row with outcome 'done' (or 'error') when the window
--     closed: code names the steps, what stopped it, and the measured cost ("step time x1.84
--     (46.1 ms vs 25.0 ms before, 5 vs 20 steps)"). python.steps rows of profiled steps are
--     real but inflated by the profiler; python.torch_trace has none for them (the tracer is
--     paused).
--   'flame' (`probe flame`): outcomes 'started', 'refused', then 'done' (or 'error') with the
--     sampler's cost in code; action_id is the session id, at_step the step when it
--     started/ended.
--   'access': a request the access rule refused (by the agent, or by its watchdog, reported
--     once each); code is 'METHOD /path', client the peer's address and uid, error the status
--     and the reason. Past 20 rows in 10 s they are only counted (`probe info`).
-- client: the peer address the request came from; requested_by: who the CLI says sent it
--   (user@host).
-- action_id: the same on every rank for one CLI command; at_step: the step it was meant for.
CREATE TABLE IF NOT EXISTS python.audit (
    timestamp    DOUBLE  NOT NULL,
    rank         INTEGER NOT NULL,
    kind         VARCHAR NOT NULL,
    client       VARCHAR,
    requested_by VARCHAR,
    code         VARCHAR NOT NULL,
    outcome      VARCHAR NOT NULL,
    error        VARCHAR,
    elapsed_ms   DOUBLE,
    action_id    VARCHAR,
    at_step      BIGINT
);

-- ---------------------------------------------------------------------------------------------
-- collectives (probe_agent/collectors/collectives.py)
-- ---------------------------------------------------------------------------------------------

-- python.collectives: one row per torch.distributed collective or point-to-point call of this
-- rank, materialised when a query names it (nothing is inserted while training runs).
-- Rows come from the Flight Recorder (every collective the process group ran, DDP/FSDP
-- internals included, last 2,000 by default) merged with Python wrappers around the public
-- torch.distributed functions (explicit calls only, with timing and call site):
--   source = 'flight_recorder' | 'python' | 'both' (a wrapped call matched to its FR entry).
-- seq: the Flight Recorder's per-group sequence number (p2p_seq_id for send/recv), equal across
--   the ranks of a group for the same collective; for 'python' rows, the agent's own count of
--   wrapped calls on that group.
-- state: 'pending' (entered, not known to have finished: a rank blocked in all_reduce),
--   'done', 'failed' (the call raised; error holds the message), 'issued' (async_op=True call
--   returned a Work and no Flight Recorder entry says whether it finished).
-- end_time/duration: NULL when unknown (the Flight Recorder has no end times on gloo).
CREATE TABLE IF NOT EXISTS python.collectives (
    rank        INTEGER NOT NULL,
    pg          VARCHAR,    -- process group name: '0' = the default group
    pg_desc     VARCHAR,    -- 'default_pg', or the group_desc given to new_group
    group_ranks INTEGER[],  -- global ranks in the group
    seq         BIGINT,
    op          VARCHAR,    -- all_reduce, broadcast, send, barrier, ...
    is_p2p      BOOLEAN,
    shapes      VARCHAR,    -- JSON: input tensor sizes, e.g. [[1024, 1024]]
    dtype       VARCHAR,    -- first input's dtype: float32, ...
    start_time  DOUBLE,     -- seconds since the epoch: call entered / work created
    end_time    DOUBLE,
    duration    DOUBLE,     -- seconds
    state       VARCHAR NOT NULL,
    error       VARCHAR,
    thread_name VARCHAR,
    callsite    VARCHAR,    -- 'file:line func' of the innermost caller outside torch
    source      VARCHAR NOT NULL
);

-- ---------------------------------------------------------------------------------------------
-- torch tracing (probe_agent/collectors/tracer/, and steps.py)
-- ---------------------------------------------------------------------------------------------
-- Steps: rows of the work leading up to optimizer step N (forward, backward, the step itself)
-- carry step = N, where N is the agent's StepClock count (one global optimizer step hook; the
-- first optimizer to step is the one counted). Jobs without a torch.optim optimizer: the first
-- 16 calls of the first root module seen are step 1 (so gradient accumulation before the first
-- optimizer step stays in step 1), then each call of it counts as one step, so inference loops
-- still get steps (and retention can drop old ones). python.steps is empty then.
-- Sampling: PROBE_TRACE=every:N (default every:10) traces steps whose number is a multiple of N,
-- all modules of those steps; `probe trace on|off|every N` changes it at run time.

-- python.torch_trace: one row per module call per stage.
--   stage: 'forward' | 'backward' | 'step' (optimizer.step(); module = the optimizer's class,
--     root = 'optimizer').
--   module: qualified name in the root model ('h.3.attn.c_proj'); the root itself is named by
--     its class ('GPT'). torch.compile/DDP/FSDP wrapper names (_orig_mod., module.) are dropped.
--   seq: 0, 1, ... for the calls of one module within one step and stage (shared modules,
--     gradient accumulation); a backward row has the seq of the forward call it belongs to.
--   duration: seconds; GPU time from CUDA events on CUDA, wall time on CPU.
--   cpu_duration: seconds of host wall time. Backward spans run from autograd reaching the
--     module's output to autograd reaching its input (its first tensor argument's grad_fn), or
--     to the next module call outside it if that comes first (approximate for parallel
--     branches). A parent's own ops between two children's backward (an attention core between
--     its projections) are in the parent's span and in none of its children's: its self time.
--   allocated, max_allocated, cached, max_cached: MiB from the CUDA caching allocator of the
--     current device, read when the row ends (forward) or starts (backward); 0 on CPU.
--   recompute: true for forward calls made during backward (activation checkpointing). They
--     are kept and flagged, not dropped, and carry the depth of the call they repeat;
--     slow_modules charges their time to the backward of the module that needed them.
--   A torch.compile'd model records one row per call of the compiled model (module = its class)
--     plus its backward and the optimizer step; code inside compiled graphs is not traced.
CREATE TABLE IF NOT EXISTS python.torch_trace (
    timestamp     DOUBLE  NOT NULL,   -- start, seconds since the epoch
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    seq           INTEGER NOT NULL,
    module        VARCHAR NOT NULL,
    stage         VARCHAR NOT NULL,
    duration      DOUBLE,
    cpu_duration  DOUBLE,
    allocated     DOUBLE,
    max_allocated DOUBLE,
    cached        DOUBLE,
    max_cached    DOUBLE,
    root          VARCHAR,            -- the root model's label: its class, 'GPT#2' for a second
    recompute     BOOLEAN,
    device        VARCHAR,            -- 'cuda' (CUDA-event timing) | 'cpu'
    depth         INTEGER,            -- nesting depth of the call (0 = root call); a backward
                                      -- row has its forward call's depth. A row's children are
                                      -- the rows of depth+1 that start within its cpu span
                                      -- (queries/slow_modules.sql uses this for self time).
    saved_bytes   BIGINT,             -- see below
    input_bytes   BIGINT
);
-- saved_bytes (forward rows of traced steps): bytes of the tensors autograd saved for backward
--   while this call's OWN forward ran (its children's are on their rows, so sum(saved_bytes)
--   over a step's forward rows is the step's activation memory and modules rank by it).
--   A storage saved twice (a tensor and its view, one input saved by two ops) counts once, on
--   the first call that saved it; parameters saved by their ops are not counted. NULL on
--   backward and step rows, and on steps not counted (torch.compile in the process; the
--   accounting switched off after a failure). Hooks a user pushes inside the step (offloading,
--   non-reentrant checkpointing) take over what they save: it is not counted here.
--   `SELECT module, sum(saved_bytes) / 2^20 AS mib FROM python.torch_trace WHERE stage =
--   'forward' AND NOT recompute AND step = (SELECT max(step) FROM python.torch_trace) GROUP BY
--   module ORDER BY mib DESC LIMIT 5` ranks the modules.
-- input_bytes (same rows): bytes of the tensor arguments of this call (their storages, once),
--   what checkpointing the module would keep saved instead of everything its forward saves.

-- python.module_calls(last): every module call of the last `last` traced steps of each rank,
-- with its self time: the call's duration minus the calls nested in that same call (never
-- negative, never more than the call). Columns: rank, step, module, part ('forward' |
-- 'backward' | 'recompute' | 'step'), duration, self (seconds). A recompute (a forward
-- call made during backward by activation checkpointing) is its own part, nested in the
-- backward call that needed it; a forward or backward run inside the optimizer step (a
-- closure) is nested in the step. The one self-time computation: queries/slow_modules.sql
-- (`probe slow`, `probe doctor`) and queries/module_self_steps.sql (`probe compare`) read it.
CREATE OR REPLACE MACRO python.module_calls(last) AS TABLE
WITH recent AS (
    SELECT rank, step FROM (SELECT DISTINCT rank, step FROM python.torch_trace)
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= last
),
-- part: calls that nest only among themselves (a recompute runs inside a backward span)
t AS (
    SELECT row_number() OVER () AS id, tt.rank, tt.step, tt.module, tt.depth, tt.duration,
           tt.timestamp AS t0, tt.timestamp + tt.cpu_duration AS t1,
           CASE WHEN coalesce(tt.recompute, false) AND tt.stage = 'forward' THEN 'recompute'
                ELSE tt.stage END AS part,
           tt.depth - 1 AS up
    FROM python.torch_trace tt SEMI JOIN recent USING (rank, step)
),
-- a call's parent: the latest call of its part one level up that started no later and
-- contains it, or a call of its own level that strictly contains it (the inner pass of a
-- reentrant checkpoint runs inside the checkpointed layer's backward); the later of the two
up1 AS (
    SELECT c.id, p.id AS pid, p.t0 AS pt0 FROM t c ASOF JOIN t p
      ON p.rank = c.rank AND p.step = c.step AND p.part = c.part AND p.depth = c.up
     AND p.t0 <= c.t0
    WHERE c.t1 <= p.t1 + 1e-6
),
up0 AS (
    SELECT c.id, p.id AS pid, p.t0 AS pt0 FROM t c ASOF JOIN t p
      ON p.rank = c.rank AND p.step = c.step AND p.part = c.part AND p.depth = c.depth
     AND p.t0 < c.t0
    WHERE c.t1 <= p.t1 + 1e-6
),
nested AS (
    SELECT id, arg_max(pid, pt0) AS pid FROM (SELECT * FROM up1 UNION ALL SELECT * FROM up0)
    GROUP BY id
),
-- a call with no parent in its part, nested in the innermost call of another part whose span
-- holds it: a recompute in the backward call whose node needed the activations, a forward or
-- backward in the optimizer step whose closure ran it (Lightning, LBFGS)
hosted AS (
    SELECT c.id, arg_max(p.id, p.depth * 1e12 + p.t0) AS pid
    FROM t c JOIN t p
      ON p.rank = c.rank AND p.step = c.step
     AND p.part = CASE c.part WHEN 'recompute' THEN 'backward' ELSE 'step' END
     AND p.t0 <= c.t0 AND c.t1 <= p.t1 + 1e-6
    WHERE c.part <> 'step' AND c.id NOT IN (SELECT id FROM nested)
    GROUP BY c.id
),
children AS (
    SELECT pid, sum(t.duration) AS inner_s
    FROM (SELECT * FROM nested UNION ALL SELECT * FROM hosted) k JOIN t USING (id)
    GROUP BY pid
),
-- per call: never negative, never more than the call (children that overlap, as parallel
-- backward branches can, are capped)
calls AS (
    SELECT t.rank, t.step, t.module, t.part, t.duration,
           greatest(t.duration - coalesce(c.inner_s, 0), 0) AS self
    FROM t LEFT JOIN children c ON c.pid = t.id
)
SELECT * FROM calls;

-- python.steps: one row per optimizer step (traced or not). start_time is the end of the
-- previous step (so data loading counts), NULL for the first step the agent saw. What the
-- agent itself ran on the training thread at that boundary (its recorders, a scheduled heap
-- walk, the one-off CPU peak probe, an action such as a checkpoint) is agent_ms, left out of
-- duration: it is not the job's step, and it must not make one look slow.
-- samples: from probe_agent.log(samples=N), else the first dimension of the root model's first
-- input in traced steps; NULL when unknown. duration in seconds.
CREATE TABLE IF NOT EXISTS python.steps (
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    start_time    DOUBLE,
    end_time      DOUBLE  NOT NULL,
    duration      DOUBLE,
    samples       BIGINT,
    samples_per_s DOUBLE,
    traced        BOOLEAN,            -- python.torch_trace has rows for this step
    -- throughput: see below
    tokens        BIGINT,
    tokens_per_s  DOUBLE,
    tokens_source VARCHAR,
    micro_batches INTEGER,
    context_len   BIGINT,
    flops         DOUBLE,
    flops_measured BOOLEAN,
    flops_6n      DOUBLE,
    flops_per_s   DOUBLE,
    compute_dtype VARCHAR,
    peak_flops    DOUBLE,
    peak_source   VARCHAR,
    mfu           DOUBLE,
    agent_ms      DOUBLE,              -- the agent's own work at the boundary before this step
    cpu_ms        DOUBLE,              -- the training thread on a CPU in this step
    cpu_wait_ms   DOUBLE,              -- runnable but waiting for a CPU (Linux run queue)
    loss          DOUBLE,              -- the step's loss (see below); NaN/Infinity kept
    loss_source   VARCHAR,             -- who reported it (see below)
    boot_id       VARCHAR,             -- the machine the rank runs on (see below)
    cpu_affinity  VARCHAR,             -- CPUs the training thread may run on ('0-3,8')
    load_1m       DOUBLE               -- the machine's 1-minute load average
);
-- loss: the value backward() was called on in this step, as the script would print it,
--   recorded with no code change (probe_agent/collectors/loss.py): unscaled when a GradScaler
--   scaled it; over several micro-batches the sum when the script divided each by their
--   number (loss / accum: nanoGPT's loss_accum), else their mean. NULL when no backward()
--   on a scalar ran in the step.
-- loss_source: 'backward' (torch.autograd.backward, Lightning's closure loss included),
--   'hf_trainer' (Trainer.training_step's return, summed over the step as the Trainer's
--   tr_loss is), 'deepspeed' (engine.backward's argument), 'accelerate'
--   (accelerator.backward's argument; both averaged over micro-batches), 'logged'
--   (probe_agent.log(loss=...) for the step, which overrides the others).
-- cpu_ms / cpu_wait_ms: /proc/thread-self/schedstat of the training thread, read at each
--   boundary (collectors/schedstat.py); NULL off Linux and for the first step. Sleeping (a
--   collective's wait, I/O) is neither. A large cpu_wait_ms is a busy host, not the job: the
--   straggler verdict uses it to tell a slow rank from a scheduler that delays ranks in turn.
-- boot_id / cpu_affinity / load_1m (collectors/placement.py; read on the training thread at a
--   boundary at most once a second, steps in between carry the last reading): boot_id is the
--   kernel's (/proc/sys/kernel/random/boot_id: the same for every container on one kernel,
--   which share its CPUs; the host name where there is none); cpu_affinity is
--   os.sched_getaffinity of the training thread in the kernel's CPU-list form (as taskset -c
--   writes it; NULL off Linux); load_1m is os.getloadavg()[0]. Ranks with one boot_id and
--   overlapping cpu_affinity share cores: which of them waits for a CPU is the scheduler's
--   pick, so the straggler verdict does not blame one of them for its cpu_wait_ms.
-- Throughput (probe_agent/collectors/throughput.py; `probe throughput` reads these):
--   tokens: tokens of this optimizer step on this rank: probe_agent.log(tokens=N) for the step
--     (summed), else B x T of the root model's integer input (the first integer tensor of 2+
--     dims among its arguments, else input_ids), summed over the step's micro-batches, on traced
--     steps; untraced steps carry the last traced step's count. Padding counts.
--   tokens_source: 'logged' | 'inputs' (this step was traced) | 'carried'.
--   tokens_per_s: tokens / duration.
--   micro_batches: calls of the root model in the step (gradient accumulation), context_len:
--     T of its token input (the largest in the step); from the last traced step.
--   flops: model FLOPs of the step on this rank (forward + backward of every micro-batch, the
--     ops torch.utils.flop_counter counts: matmuls, convolutions, attention). flops_measured:
--     this step ran under FlopCounterMode (measured once, again when the input shapes change,
--     at most every 50 steps; its duration is the measurement's cost, so rates leave it out);
--     other steps scale the measured FLOPs per token by their tokens.
--   flops_6n: 6 x trainable parameters x tokens, the analytic estimate beside the measurement.
--   flops_per_s: flops / duration (achieved). compute_dtype: the dtype the matmuls ran in
--     (autocast's, else the parameters'; 'tf32' for float32 on CUDA with TF32 allowed).
--   peak_flops: the device's dense peak in that dtype (a data sheet table by GPU name), or on
--     CPU a matmul measured once per node; peak_source says which. mfu = flops_per_s / peak.

-- python.memory: one row per optimizer step per device, taken right after the step.
-- device 'cuda:N' (torch.cuda.memory_stats of the current device, only once the job has
-- initialised CUDA): allocated, reserved, active, peak (allocated high-water mark) in MiB,
-- alloc_retries and ooms (counts since start). device 'cpu': those are NULL. rss: the process
-- resident set in MiB, on every row. The agent's own share of it, sampled every ~2 s on the
-- writer thread: agent_mib (its in-memory DuckDB: sum of duckdb_memory(), plus pyarrow's
-- allocated bytes), agent_threads (threads named probe*), heap_free_mib (the free bytes glibc's
-- malloc keeps in its arenas, mallinfo2's fordblks: resident, used by nobody; NULL without
-- glibc 2.33). On CPU the job's memory is rss - agent_mib - heap_free_mib.
CREATE TABLE IF NOT EXISTS python.memory (
    timestamp     DOUBLE  NOT NULL,
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    device        VARCHAR NOT NULL,
    allocated     DOUBLE,
    reserved      DOUBLE,
    active        DOUBLE,
    peak          DOUBLE,
    alloc_retries BIGINT,
    ooms          BIGINT,
    rss           DOUBLE,
    agent_mib     DOUBLE,
    agent_threads INTEGER,
    heap_free_mib DOUBLE,
    params_mib      DOUBLE,           -- memory by kind: see below
    grads_mib       DOUBLE,
    optimizer_mib   DOUBLE,
    activations_mib DOUBLE,
    params_fp32_mib DOUBLE,
    sharded         BOOLEAN,
    capacity_mib    DOUBLE
);
-- Memory by kind, on traced steps (NULL on the others), in MiB, of this rank:
--   params_mib: parameters (the local shard of FSDP2 DTensors; each storage once),
--   grads_mib: their .grad right after optimizer.step(),
--   optimizer_mib: the state tensors of every optimizer seen stepping (AdamW: exp_avg and
--     exp_avg_sq per parameter, plus its step counters; a sharded optimizer's local share),
--   activations_mib: the bytes autograd saved for backward in the step's largest forward pass
--     (gradient accumulation: the largest micro-batch), python.torch_trace.saved_bytes summed;
--     NULL when that step was not counted.
-- The rest: on CUDA allocated - params - grads - optimizer; on CPU the job's memory
-- (rss - agent_mib - heap_free_mib) minus those. Activations are freed by the time the row is
-- taken (after the step), so they add to it: peak ~ params + grads + optimizer + activations +
-- the rest.
--   params_fp32_mib: the float32 part of params_mib (what bf16 would halve),
--   sharded: some parameter is a DTensor (FSDP2): its optimizer state is sharded already.
-- capacity_mib: the CUDA device's total memory (NULL on CPU).

-- python.ooms: one row per CUDA out-of-memory the allocator raised, recorded by its OOM observer
-- (probe_agent/collectors/oom.py) inside the failing allocation, on the thread that asked.
-- Also written to <run_dir>/<pid>.oom.json, which the watchdog adds to the dead rank's exit.
--   step: the step being computed (the last finished + 1). MiB throughout:
--   request_mib: the allocation that failed; device_allocated_mib, device_free_mib: what the
--     allocator told its observers (its bytes on the device, the device's free bytes);
--   capacity_mib: the device's total; allocated_mib, reserved_mib, active_mib,
--   inactive_split_mib: memory_stats() at that moment;
--   largest_free_block_mib: the largest inactive block in the allocator's cache;
--   fragmented: reserved - allocated would hold the request, yet no free block is as large
--     (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is the lever);
--   ooms, alloc_retries: the allocator's counts so far;
--   params_mib .. activations_mib: the last traced step's memory by kind (python.memory);
--   stack: the Python stack of the failing call, one 'file:line func' a line, innermost last;
--   snapshot: the allocator-history pickle written beside it when `probe memory --snapshot`
--     was recording (pytorch.org/memory_viz opens it), else NULL.
CREATE TABLE IF NOT EXISTS python.ooms (
    timestamp              DOUBLE  NOT NULL,
    rank                   INTEGER NOT NULL,
    step                   BIGINT  NOT NULL,
    device                 VARCHAR,
    request_mib            DOUBLE,
    device_allocated_mib   DOUBLE,
    device_free_mib        DOUBLE,
    capacity_mib           DOUBLE,
    allocated_mib          DOUBLE,
    reserved_mib           DOUBLE,
    active_mib             DOUBLE,
    inactive_split_mib     DOUBLE,
    largest_free_block_mib DOUBLE,
    fragmented             BOOLEAN,
    ooms                   BIGINT,
    alloc_retries          BIGINT,
    params_mib             DOUBLE,
    grads_mib              DOUBLE,
    optimizer_mib          DOUBLE,
    activations_mib        DOUBLE,
    stack                  VARCHAR,
    snapshot               VARCHAR
);

-- python.job_memory: the job's own memory, one definition that `probe memory`, `probe doctor`,
-- the dashboard and GET /v1/metrics all read. host_mib: the RSS minus the agent's share
-- (agent_mib) and minus the free bytes malloc keeps (heap_free_mib: fragmentation, not use; a
-- healthy polled rank's RSS grew 66 MiB while its bytes in use stayed flat), on every row.
-- job_mib: what a memory verdict judges on that device: CUDA allocated on 'cuda:N' rows,
-- host_mib on 'cpu' rows; measure names which. Every column of python.memory comes first.
CREATE VIEW IF NOT EXISTS python.job_memory AS
SELECT *,
       CASE WHEN device LIKE 'cuda%' THEN 'CUDA allocated' ELSE 'job RSS' END AS measure,
       CASE WHEN device LIKE 'cuda%' THEN allocated
            ELSE rss - coalesce(agent_mib, 0) - coalesce(heap_free_mib, 0) END AS job_mib,
       rss - coalesce(agent_mib, 0) - coalesce(heap_free_mib, 0) AS host_mib
FROM python.memory;

-- python.metrics: scalars from probe_agent.log(step=None, **scalars), one row per scalar.
-- step defaults to the last finished optimizer step (log usually follows optimizer.step());
-- pass step= to be exact. value is DOUBLE (tensors are converted off the training thread; a
-- value that is not a number is stored as NaN).
CREATE TABLE IF NOT EXISTS python.metrics (
    timestamp     DOUBLE  NOT NULL,
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    name          VARCHAR NOT NULL,
    value         DOUBLE
);

-- ---------------------------------------------------------------------------------------------
-- the training loop around the model (probe_agent/collectors/trainloop.py), for
-- `probe doctor`. Recorded on every optimizer step, traced or not.
-- ---------------------------------------------------------------------------------------------

-- python.step_stats: one row per optimizer step (the StepClock's count, as python.steps).
-- data_wait: seconds spent inside DataLoader iterators' __next__ since the previous step ended
--   (data_wait / python.steps.duration is the share of the step spent waiting for data);
--   batches: how many batches were drawn in that time.
-- lr: the primary optimizer's first param group's learning rate after the step.
-- grad_norm / clip_max_norm: the total gradient norm clip_grad_norm_ computed (before clipping;
--   NaN or Infinity when a gradient is) and its max_norm, for the last call in that step; NULL
--   when clip_grad_norm_ was not called. clip_calls: calls in that step.
-- grad_scale: the AMP GradScaler's scale when that clip_grad_norm_ saw gradients the scaler had
--   not unscaled yet (scaler.unscale_ not called first): grad_norm is then scale times the real
--   norm, and the clip is wrong. NULL without a scaler, or once unscale_ ran.
-- ckpt_wait: seconds inside checkpoint saves on the training thread since the previous step
--   (torch.save, torch.distributed.checkpoint.save/async_save, safetensors save_file/save_model,
--   looked up at call time; nested saves once). eval_wait: seconds from a module's eval() to its
--   next train() between two optimizer steps, less the saves inside (a model still in eval mode
--   at the optimizer step trains in eval mode: not counted). 0 when none.
CREATE TABLE IF NOT EXISTS python.step_stats (
    timestamp     DOUBLE  NOT NULL,
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    data_wait     DOUBLE,
    batches       BIGINT,
    lr            DOUBLE,
    grad_norm     DOUBLE,
    clip_max_norm DOUBLE,
    clip_calls    BIGINT,
    grad_scale    DOUBLE,
    ckpt_wait     DOUBLE,
    eval_wait     DOUBLE
);

-- python.numerics: the loss and gradient health, per rank, step and module
-- (probe_agent/collectors/numerics.py, module_stats.py, nan_hunt.py). kind says which rows:
--   'step': one per optimizer step, module '(total)': the total gradient norm of the step
--     (grad_norm: clip_grad_norm_'s pre-clip norm when the script clips, unscaled when it
--     clipped gradients the GradScaler had not unscaled yet; else the norm over every
--     gradient the optimizers hold, this rank's shard under FSDP2), taken right before
--     optimizer.step(); grad_nonfinite when it or the loss is NaN/Inf; clip_max_norm when
--     clip_grad_norm_ ran; note 'spike xF' when the loss was F times its recent median.
--     NULL grad_norm: the GradScaler skipped optimizer.step() (no finite gradients).
--   'module': on traced steps, one per module that holds parameters (and per module whose
--     forward ran, for max_abs_act): grad_norm and weight_norm of its own parameters
--     (recurse=False), update_ratio = ||w_after - w_before|| / ||w_before|| of this step's
--     optimizer.step() (NULL when the weights are over 1 GiB: no copy is made), max_abs_act
--     the largest |value| of its forward outputs in the step (NaN/Infinity when non-finite).
--   'anomaly': a step whose loss spiked (note 'spike xF') or was non-finite (note
--     'nonfinite'): module '(total)' with samples (the DataLoader indices of the step's
--     batches: 'batch 0: [17, 3, ...]'), and one row per module with its grad_norm, to compare
--     with the last 'module' rows (which modules jumped). At most 20 per run.
--   'origin': where the first non-finite value came from, from one re-run of the first bad
--     step's forward and backward before the optimizer ruined the weights (nan_hunt.py):
--     module (or '(none)' when this rank's re-run stayed finite: it received the value, e.g.
--     through DDP's gradient all-reduce), stage 'input' | 'forward' | 'backward' | 'none'
--     | 'unchecked' (no re-run happened: no root model seen yet, inputs not kept, or the
--     re-run failed; note says which),
--     role 'produced' | 'received', op (the torch function, or the autograd node and aten op
--     in backward), samples (DataLoader indices, or rows of the batch: note says which), note
--     (the step's loss and norm, the micro-batch, the re-run's cost).
CREATE TABLE IF NOT EXISTS python.numerics (
    timestamp      DOUBLE  NOT NULL,
    rank           INTEGER NOT NULL,
    step           BIGINT,
    module         VARCHAR NOT NULL,
    kind           VARCHAR NOT NULL,
    grad_norm      DOUBLE,
    weight_norm    DOUBLE,
    update_ratio   DOUBLE,
    max_abs_act    DOUBLE,
    act_nonfinite  BOOLEAN,
    grad_nonfinite BOOLEAN,
    clip_max_norm  DOUBLE,
    stage          VARCHAR,
    role           VARCHAR,
    op             VARCHAR,
    samples        VARCHAR,
    note           VARCHAR
);

-- python.schedule: the job's LR schedule in steps, one row per top-level LR scheduler each time
-- it is read (probe_agent/collectors/schedule.py: at the first optimizer step seen, then at
-- steps 10, 100, 1000, ...). Not a step table: a handful of rows per run, never trimmed.
-- step: the optimizer step it was read at. scheduler: the class (a LambdaLR with its function,
--   a SequentialLR with what it holds); NULL with kind 'none' when no scheduler steps the
--   job's optimizers. location: how the job reaches it (trainer.lr_scheduler, sched, ...).
-- kind: 'warmup+decay' | 'decay' | 'warmup' | 'constant' | 'periodic' | 'warmup+periodic' |
--   'opaque' | 'none'. method: 'read' (from its settings: OneCycleLR total_steps, T_max,
--   total_iters, milestones, HF's num_training_steps, DeepSpeed's total_num_steps) |
--   'measured' (a LambdaLR's function called for steps 0..N) | 'opaque' (neither; note says why).
-- warmup_steps / end_step: scheduler steps at which the warmup and the decay end (NULL when it
--   has none, or it cannot be known). after_end: 'constant' | 'rises' (periodic: the cosine
--   climbs again) | 'raises' (OneCycleLR raises ValueError past total_steps).
-- sched_steps: the scheduler's own count (last_epoch) when read; about step - 1 when it steps
--   once per optimizer step (it steps after optimizer.step()), far below for a per-epoch one.
-- total_steps / total_source: the optimizer steps the framework says the job runs
--   (Trainer.state.max_steps, TrainingArguments.max_steps, Lightning Trainer.max_steps or
--   estimated_stepping_batches); NULL in a hand-written loop. framework: discovery's name.
CREATE TABLE IF NOT EXISTS python.schedule (
    timestamp     DOUBLE  NOT NULL,
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    scheduler     VARCHAR,
    location      VARCHAR,
    kind          VARCHAR,
    method        VARCHAR,
    warmup_steps  BIGINT,
    end_step      BIGINT,
    after_end     VARCHAR,
    sched_steps   BIGINT,
    total_steps   BIGINT,
    total_source  VARCHAR,
    framework     VARCHAR,
    note          VARCHAR
);

-- python.parallel: the job's tensor/pipeline-parallel layout as this rank read it
-- (probe_agent/collectors/parallel.py: at the first optimizer step seen, then at steps 10 and
-- 100; a process without a process group is world 1). Not a step table: 3 rows, never trimmed.
-- source: 'DeviceMesh' | 'megatron parallel_state' | 'deepspeed PipelineEngine', or NULL when
--   none was found (tp = pp = 1 then: the data-parallel world is assumed to be every rank).
-- mesh: the dims as read ('dp=1, tp=2'). tp / pp: tensor- and pipeline-parallel sizes (a
--   DeviceMesh's dims named tp/tensor and pp/pipe/pipeline; every other dim is data parallel).
-- world: the process group's size. The data-parallel world is world / (tp x pp).
CREATE TABLE IF NOT EXISTS python.parallel (
    timestamp     DOUBLE  NOT NULL,
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    source        VARCHAR,
    mesh          VARCHAR,
    tp            INTEGER,
    pp            INTEGER,
    world         INTEGER
);

-- python.host_syncs: the training thread's host syncs per optimizer step, by call site
-- (probe_agent/collectors/host_syncs.py; counted on every step from the second one seen). One
-- row per (step, kind, call site) with calls > 0; past the 32 busiest sites of a step the rest
-- are one row per kind with file NULL. Calls made inside torch are attributed to the first
-- frame outside torch that led to them; nested calls (format calling .item()) count once.
-- kind: 'item' (.item(), bool/int/float of a tensor) | 'tolist' | 'cpu' (.cpu()/.numpy(); of a
--   CPU tensor only in a process with no CUDA context; and .to("cpu") of a device tensor,
--   not non_blocking, counted once the process has a CUDA context) | 'print' (repr/format) |
--   'data_shape' (nonzero, argwhere, masked_select, unique, bincount, one-argument
--   torch.where) | 'synchronize' (torch.cuda.synchronize, Stream/Event.synchronize).
-- file / line / func: the call site. calls: how many times that site synced in that step.
-- seconds: host time inside those calls (on CUDA mostly the wait for the device: what the syncs
--   cost; on CPU the conversion alone).
CREATE TABLE IF NOT EXISTS python.host_syncs (
    timestamp     DOUBLE  NOT NULL,
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    kind          VARCHAR NOT NULL,
    file          VARCHAR,
    line          INTEGER,
    func          VARCHAR,
    calls         BIGINT  NOT NULL,
    seconds       DOUBLE
);

-- python.compile_state: whether this rank runs torch.compile'd code, as torch reports it
-- (probe_agent/collectors/compile_state.py: read from torch._dynamo's own counters at each
-- optimizer step, a row written when they change and at steps 1, 10, 100, 1000, ...; reading
-- them compiles nothing). Not a step table: a handful of rows per run, never trimmed.
-- dynamo: torch._dynamo is imported at all. frames: frames dynamo compiled (recompiles
--   included); graphs: graphs captured. graph_breaks: dynamo's graph-break count (each break
--   splits a compiled frame into graphs with Python between them); top_break: the most
--   frequent reason's first line. recompiles: compilations of a frame already compiled
--   (torch's recompile_reason set); last_recompile: the last reason.
-- compiled_root / compiled_modules: the model's root module runs compiled (an OptimizedModule
--   or module.compile()), and the qualified names of compiled submodules (comma-separated, at
--   most 20), when a model is known (the tracer's root, or the module the optimizer trains).
CREATE TABLE IF NOT EXISTS python.compile_state (
    timestamp        DOUBLE  NOT NULL,
    rank             INTEGER NOT NULL,
    step             BIGINT  NOT NULL,
    dynamo           BOOLEAN,
    frames           BIGINT,
    graphs           BIGINT,
    graph_breaks     BIGINT,
    top_break        VARCHAR,
    recompiles       BIGINT,
    last_recompile   VARCHAR,
    compiled_root    BOOLEAN,
    compiled_modules VARCHAR
);

-- python.module_flops: where the FLOP-measured step's tensor work ran, per module
-- (probe_agent/collectors/flops.py: the same dispatch mode that counts the step's FLOPs; a
-- forward op belongs to the innermost module whose forward is on the Python stack, backward and
-- optimizer ops to module NULL). step: the measured step. flops: FLOPs counted there (matmul,
-- convolution, attention; elementwise ops count 0). ops: aten ops dispatched. op_ms: host time
-- spent inside those ops (on CPU their compute; on CUDA only their launch).
CREATE TABLE IF NOT EXISTS python.module_flops (
    timestamp     DOUBLE  NOT NULL,
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    module        VARCHAR,
    flops         DOUBLE,
    ops           BIGINT,
    op_ms         DOUBLE
);

-- python.moe_load: tokens each expert of each top-k router got, per sampled step
-- (probe_agent/collectors/moe.py). A router is found without a code change: a module with a
-- gate (a Linear, or a router module) and its experts (a ModuleList, or a fused experts module
-- with num_experts), as in HF Mixtral/Qwen-MoE, torchtitan and plain code. Sampled on traced
-- steps (PROBE_TRACE), and never under torch.compile (a hook would recompile the model).
-- layer: the MoE block's qualified name. expert: its index. tokens: token-to-expert
--   assignments over the step's forward calls (each token counts top_k times). experts / top_k:
--   the router's size (over all ranks: an expert-parallel rank routes to every expert) and k.
-- owner: with expert parallelism, the global rank that holds the expert (read from the experts'
--   DTensor sharding on dim 0, as torchtitan lays them out, or from an expert-parallel process
--   group on the block, as DeepSpeed-MoE and megablocks do: collectors/moe_layout.py); NULL
--   when every rank holds every expert.
CREATE TABLE IF NOT EXISTS python.moe_load (
    timestamp     DOUBLE  NOT NULL,
    rank          INTEGER NOT NULL,
    step          BIGINT  NOT NULL,
    layer         VARCHAR NOT NULL,
    expert        INTEGER NOT NULL,
    tokens        BIGINT  NOT NULL,
    experts       INTEGER,
    top_k         INTEGER,
    owner         INTEGER
);

-- python.unused_params: the parameters that got no gradient, per rank and step
-- (probe_agent/collectors/unused_params.py), read right before optimizer.step() on traced steps
-- and on the first 5 steps of a job of more than one rank. Not a step table: a few rows a run.
-- step: the optimizer step (the one about to finish). param: the parameter's qualified name in
--   the job's model (a DDP wrapper's "module." prefix taken off), or NULL on a recorded step
--   where every parameter got a gradient (one row then). module: its module's qualified name
--   ('' for a parameter of the root). numel: its elements. params: the stepping optimizer's
--   parameter count. find_unused: the job's DDP find_unused_parameters (NULL: no DDP found).
CREATE TABLE IF NOT EXISTS python.unused_params (
    timestamp    DOUBLE  NOT NULL,
    rank         INTEGER NOT NULL,
    step         BIGINT  NOT NULL,
    param        VARCHAR,
    module       VARCHAR,
    numel        BIGINT,
    params       BIGINT,
    find_unused  BOOLEAN
);
