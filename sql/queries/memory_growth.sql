-- name: memory_growth
-- description: Memory growth per step over the last $steps steps of each rank and device, leaving out the first $warmup steps the rank recorded (warm-up: optimizer state, caches; `probe memory` sends 0 unless --warmup, `probe doctor` 10): RSS (always) and CUDA allocated/reserved (MiB), first and last value, growth per step (least-squares slope), peak, alloc retries and OOMs. A steady positive growth per step is a leak. The one memory-growth query: `probe memory` and `probe doctor` both read it (issue 18).
-- params: steps, warmup
WITH m AS (
    SELECT * FROM python.memory
    WHERE step >= (SELECT min(step) FROM python.memory) + $warmup
    QUALIFY row_number() OVER (PARTITION BY rank, device ORDER BY step DESC) <= $steps
)
SELECT rank, device, count(*) AS steps, min(step) AS first_step, max(step) AS last_step,
       round(arg_min(rss, step), 1) AS rss_first_mib,
       round(arg_max(rss, step), 1) AS rss_last_mib,
       round(regr_slope(rss, step), 3) AS rss_mib_per_step,
       round(arg_min(allocated, step), 1) AS allocated_first_mib,
       round(arg_max(allocated, step), 1) AS allocated_mib,
       round(regr_slope(allocated, step), 3) AS allocated_mib_per_step,
       round(arg_max(reserved, step), 1) AS reserved_mib,
       round(max(peak), 1) AS peak_mib,
       max(alloc_retries) AS alloc_retries,
       max(ooms) AS ooms
FROM m
GROUP BY rank, device
ORDER BY rank, device;
