-- name: cpu_window
-- description: This rank's training thread over the steps that ended at or after $since (seconds since the epoch; `probe straggler` and `probe doctor` pass the start of the collectives they judge, so both cover one window): the share of that time it waited for a CPU (cpu_wait_share: runnable, in the run queue) and ran on one (cpu_run_share), of the time between the steps' boundaries (duration plus the agent's own work at the boundary, the span the scheduler counters cover), and where it ran at the last of them: the machine (boot_id), the CPUs it may use (cpu_affinity, as taskset -c writes them) and the machine's median 1-minute load (load_1m). NULL shares off Linux.
-- params: since
WITH w AS (
    SELECT step, cpu_ms, cpu_wait_ms, duration * 1e3 + coalesce(agent_ms, 0) AS span_ms,
           boot_id, cpu_affinity, load_1m
    FROM python.steps WHERE end_time >= $since
)
SELECT count(*)                                                             AS steps,
       round(sum(cpu_wait_ms) / nullif(sum(span_ms) FILTER (WHERE cpu_wait_ms IS NOT NULL), 0),
             4)                                                             AS cpu_wait_share,
       round(sum(cpu_ms) / nullif(sum(span_ms) FILTER (WHERE cpu_ms IS NOT NULL), 0), 4)
                                                                            AS cpu_run_share,
       arg_max(boot_id, step)                                               AS boot_id,
       arg_max(cpu_affinity, step)                                          AS cpu_affinity,
       median(load_1m)                                                      AS load_1m
FROM w;
