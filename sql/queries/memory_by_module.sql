-- name: memory_by_module
-- description: CUDA memory per module over the last $last traced steps (MiB): the most allocated when a forward call ended and when its backward started, the allocator peak, and the most reserved (cached). All zero on CPU; use memory_growth there.
-- params: last, limit
WITH recent AS (
    SELECT rank, step FROM (SELECT DISTINCT rank, step FROM python.torch_trace)
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $last
),
t AS (
    SELECT tt.* FROM python.torch_trace tt SEMI JOIN recent USING (rank, step)
    WHERE NOT coalesce(tt.recompute, false)
)
SELECT rank, module,
       round(max(allocated) FILTER (WHERE stage = 'forward'), 1) AS fwd_allocated_mib,
       round(max(allocated) FILTER (WHERE stage = 'backward'), 1) AS bwd_allocated_mib,
       round(max(max_allocated), 1) AS peak_allocated_mib,
       round(max(cached), 1) AS cached_mib,
       count(DISTINCT step) AS steps
FROM t
GROUP BY rank, module
QUALIFY row_number() OVER (PARTITION BY rank ORDER BY max(allocated) DESC NULLS LAST) <= $limit
ORDER BY rank, max(allocated) DESC NULLS LAST;
