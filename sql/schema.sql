-- schema.sql: every table the probe agent writes. The only DDL in the project.
--
-- Conventions: every table carries `rank`, so results from many ranks concatenate; tables that
-- grow with training carry `step`, and retention (PROBE_RETENTION_MB) drops their oldest steps
-- first. Timestamps are seconds since the Unix epoch (DOUBLE). Unqualified names resolve:
-- queries run with search_path = python,main.

CREATE SCHEMA IF NOT EXISTS python;

-- python.backtrace: one row per frame of every thread, materialised when a query names it
-- (the snapshot is taken at the start of that query). depth 0 = innermost frame.
-- The agent's own threads (probe-agent.*) are left out. locals is NULL unless asked for by
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

-- python.evals: the audit log of every /v1/eval (and, later, every step-boundary action).
-- code is stored as sent; outcome is 'ok' | 'error' | 'timeout' | 'refused'.
CREATE TABLE IF NOT EXISTS python.evals (
    timestamp   DOUBLE  NOT NULL,
    rank        INTEGER NOT NULL,
    client      VARCHAR,          -- peer address, or 'unix:uid=N'
    code        VARCHAR NOT NULL,
    outcome     VARCHAR NOT NULL,
    error       VARCHAR,
    elapsed_ms  DOUBLE
);

-- ---------------------------------------------------------------------------------------------
-- issue 4: collectives (probe_agent/collectors/collectives.py)
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
-- issue 6: step-boundary actions (probe_agent/actions.py) share the audit table python.evals.
-- ---------------------------------------------------------------------------------------------
-- kind: 'eval' for /v1/eval (the default), else the step-boundary action's kind:
--   'step-eval' (eval --at-step/--next-step), 'lr', 'checkpoint', 'pause', 'resume', 'cancel'.
-- One action writes several rows as it moves on: outcome 'queued' (accepted), 'refused' (not
--   accepted: no optimizer step seen, step already passed, ...), 'overrun' (still running past
--   PROBE_ACTION_TIMEOUT_S), then exactly one of 'ok' | 'error' | 'cancelled' | 'skipped' (not
--   every rank reached the step in time, so it ran nowhere).
-- action_id: the same on every rank for one CLI command; at_step: the step it was meant for
--   (not named `step`: the store trims tables with a `step` column, and an audit log is kept whole).
-- requested_by: who the CLI says sent it (user@host); client is the peer address it came from.
ALTER TABLE python.evals ADD COLUMN IF NOT EXISTS kind VARCHAR DEFAULT 'eval';
ALTER TABLE python.evals ADD COLUMN IF NOT EXISTS action_id VARCHAR;
ALTER TABLE python.evals ADD COLUMN IF NOT EXISTS at_step BIGINT;
ALTER TABLE python.evals ADD COLUMN IF NOT EXISTS requested_by VARCHAR;
