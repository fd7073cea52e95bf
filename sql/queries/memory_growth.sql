-- name: memory_growth
-- description: Memory growth per step over the last $last steps of each rank and device, leaving out the first $warmup steps the rank recorded, or its first quarter when longer (warm-up: optimizer state, caches, the allocator's first arenas; measured on a healthy 2-rank job: ~160 KiB/step over the first 100 steps, ~35 KiB/step by step 300, flat later). The measure is the job's own memory, python.job_memory's job_mib: on CUDA allocated, on CPU the RSS minus the agent's share (agent_mib: its DuckDB) and minus the free bytes malloc keeps (heap_free_mib: fragmentation, not use). mem_mib_per_step is a robust slope (Theil-Sen: the median of the pairwise slopes over up to 120 evenly spaced steps), late_mib_per_step the same over the second half, rising_quarters how many of the 3 steps between the medians of the window's 4 quarters go up (3: it grows all along). A leak: a positive slope that keeps up in the second half with rising_quarters = 3, and that adds up. Also raw RSS, the agent's MiB first and last, CUDA reserved, peak, alloc retries and OOMs. The one memory-growth query: `probe memory` and `probe doctor` both read it.
-- params: last, warmup
WITH span AS (
    SELECT rank, device, min(step) AS lo, max(step) AS hi FROM python.job_memory GROUP BY ALL
),
m AS (
    SELECT mem.*, job_mib AS v
    FROM python.job_memory mem JOIN span USING (rank, device)
    WHERE step >= lo + greatest($warmup, (hi - lo) // 4)
    QUALIFY row_number() OVER (PARTITION BY mem.rank, mem.device ORDER BY step DESC) <= $last
),
n AS (
    SELECT *,
           row_number() OVER (PARTITION BY rank, device ORDER BY step) AS i,
           count(*) OVER (PARTITION BY rank, device) AS cnt,
           ntile(4) OVER (PARTITION BY rank, device ORDER BY step) AS quarter
    FROM m
),
thin AS (SELECT * FROM n WHERE i % greatest(1, cnt // 120) = 0),
pairs AS (
    SELECT a.rank, a.device,
           median((b.v - a.v) / (b.step - a.step)) AS ts,
           median((b.v - a.v) / (b.step - a.step)) FILTER (WHERE a.quarter >= 3) AS ts_late
    FROM thin a JOIN thin b ON a.rank = b.rank AND a.device = b.device AND b.step > a.step
    GROUP BY a.rank, a.device
),
q AS (
    SELECT rank, device,
           median(v) FILTER (WHERE quarter = 1) AS q1, median(v) FILTER (WHERE quarter = 2) AS q2,
           median(v) FILTER (WHERE quarter = 3) AS q3, median(v) FILTER (WHERE quarter = 4) AS q4
    FROM n GROUP BY rank, device
)
SELECT n.rank, n.device, any_value(n.measure) AS measure,
       count(*) AS steps, min(step) AS first_step, max(step) AS last_step,
       round(arg_min(v, step), 1) AS mem_first_mib,
       round(arg_max(v, step), 1) AS mem_last_mib,
       round(any_value(p.ts), 4) AS mem_mib_per_step,
       round(any_value(p.ts_late), 4) AS late_mib_per_step,
       any_value((q.q2 > q.q1)::INT + (q.q3 > q.q2)::INT + (q.q4 > q.q3)::INT) AS rising_quarters,
       round(arg_min(rss, step), 1) AS rss_first_mib,
       round(arg_max(rss, step), 1) AS rss_last_mib,
       round(arg_min(agent_mib, step), 1) AS agent_first_mib,
       round(arg_max(agent_mib, step), 1) AS agent_last_mib,
       arg_max(agent_threads, step) AS agent_threads,
       round(arg_max(heap_free_mib, step), 1) AS heap_free_mib,
       round(arg_max(allocated, step), 1) AS allocated_mib,
       round(arg_max(reserved, step), 1) AS reserved_mib,
       round(max(peak), 1) AS peak_mib,
       max(alloc_retries) AS alloc_retries,
       max(ooms) AS ooms
FROM n
LEFT JOIN pairs p ON p.rank = n.rank AND p.device = n.device
LEFT JOIN q ON q.rank = n.rank AND q.device = n.device
GROUP BY n.rank, n.device
ORDER BY n.rank, n.device;
