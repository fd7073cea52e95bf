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
