-- name: doctor_memory
-- description: Memory over this rank's last $last_steps steps (leaving out the first 10 it recorded: warm-up), per device (python.memory): growth per step (least-squares slope) of the process RSS and, on CUDA, of allocated and reserved memory, with the first and last values, the peak, and the allocator's OOM and retry counts. `probe doctor` reads it.
-- params: last_steps
SELECT device,
       count(*)                                  AS steps,
       min(step)                                 AS first_step,
       max(step)                                 AS last_step,
       round(arg_min(rss, step), 1)              AS rss_first,
       round(arg_max(rss, step), 1)              AS rss_last,
       round(regr_slope(rss, step), 4)           AS rss_per_step,
       round(arg_min(allocated, step), 1)        AS allocated_first,
       round(arg_max(allocated, step), 1)        AS allocated_last,
       round(regr_slope(allocated, step), 4)     AS allocated_per_step,
       round(arg_max(reserved, step), 1)         AS reserved_last,
       round(regr_slope(reserved, step), 4)      AS reserved_per_step,
       round(max(peak), 1)                       AS peak,
       max(ooms)                                 AS ooms,
       max(alloc_retries)                        AS alloc_retries
FROM python.memory
WHERE step > (SELECT max(step) FROM python.memory) - $last_steps
  AND step > (SELECT min(step) FROM python.memory) + 10  -- warm-up: optimizer state, caches
GROUP BY device
ORDER BY device;
