-- name: dashboard_series
-- description: This rank's last $last steps for the dashboard's charts: step, duration (s), end_time, job_mib (the job's own host memory, python.job_memory's host_mib: RSS less the agent's share and the free heap, as `probe memory` and doctor judge it), and CUDA allocated and reserved summed over devices (NULL on CPU). `probe ui` reads it.
-- params: last
SELECT s.step, s.duration, s.end_time, m.job_mib, m.allocated, m.reserved
FROM (SELECT step, duration, end_time FROM python.steps ORDER BY step DESC LIMIT $last) s
LEFT JOIN (SELECT step, any_value(host_mib) AS job_mib, sum(allocated) AS allocated,
                  sum(reserved) AS reserved FROM python.job_memory GROUP BY step) m USING (step)
ORDER BY s.step;
