-- name: host_syncs
-- description: Host syncs of each rank over its last $last optimizer steps (python.host_syncs: .item(), .tolist(), .cpu()/.numpy()/.to("cpu"), print/format of a tensor, data-dependent shapes such as nonzero, synchronize), counted on every step: syncs_per_step is the median over the window's steps of all its syncs (0 for a step with none), and the $limit busiest call sites each with its calls per step (the median over the window's steps, 0 where it made none; mean_per_step: its calls over the window / the window's steps); sync_ms_per_step: the median step's host time inside its syncs (on CUDA the wait for the device) and the steps it synced in. One row per rank and site; a rank with no sync in the window has one row with kind NULL. The first step the agent saw is not counted (the counter starts there).
-- params: last, limit
WITH s AS (
    SELECT rank, step FROM python.steps WHERE duration IS NOT NULL AND step > (
        SELECT coalesce(min(step), 0) FROM python.steps)
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $last
),
per_step AS (
    SELECT s.rank, s.step, coalesce(sum(h.calls), 0) AS calls,
           coalesce(sum(h.seconds), 0) AS seconds
    FROM s LEFT JOIN python.host_syncs h USING (rank, step)
    GROUP BY s.rank, s.step
),
ranks AS (
    SELECT rank, count(*) AS steps, median(calls) AS syncs_per_step, max(calls) AS max_per_step,
           median(seconds) * 1e3 AS sync_ms_per_step
    FROM per_step GROUP BY rank
),
top AS (
    SELECT h.rank, h.kind, h.file, h.line, any_value(h.func) AS func, sum(h.calls) AS calls,
           count(DISTINCT h.step) AS in_steps
    FROM python.host_syncs h SEMI JOIN s USING (rank, step)
    GROUP BY h.rank, h.kind, h.file, h.line
    QUALIFY row_number() OVER (PARTITION BY h.rank ORDER BY sum(h.calls) DESC, h.file, h.line)
            <= $limit
),
-- each top site's calls in each window step, 0 where it made none: its median step
site_steps AS (
    SELECT t.rank, t.kind, t.file, t.line, s.step, coalesce(sum(h.calls), 0) AS calls
    FROM top t JOIN s USING (rank)
    LEFT JOIN python.host_syncs h ON h.rank = t.rank AND h.step = s.step AND h.kind = t.kind
         AND h.file IS NOT DISTINCT FROM t.file AND h.line IS NOT DISTINCT FROM t.line
    GROUP BY ALL
),
sites AS (
    SELECT t.*, m.per_step
    FROM top t JOIN (SELECT rank, kind, file, line, median(calls) AS per_step FROM site_steps
                     GROUP BY ALL) m
      ON m.rank = t.rank AND m.kind = t.kind AND m.file IS NOT DISTINCT FROM t.file
         AND m.line IS NOT DISTINCT FROM t.line
)
SELECT r.rank, r.steps, r.syncs_per_step, r.max_per_step,
       round(r.sync_ms_per_step, 3) AS sync_ms_per_step, x.kind, x.file, x.line, x.func,
       x.per_step AS calls_per_step, round(x.calls / r.steps, 2) AS mean_per_step, x.in_steps
FROM ranks r LEFT JOIN sites x USING (rank)
ORDER BY r.rank, x.calls DESC NULLS LAST, x.file, x.line
