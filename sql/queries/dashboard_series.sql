-- name: dashboard_series
-- description: This rank's last $last steps for the dashboard's charts: step, duration (s), end_time, job_mib (the job's own host memory, python.job_memory's host_mib: RSS less the agent's share and the free heap, as `probe memory` and doctor judge it), CUDA allocated and reserved summed over devices (NULL on CPU), the step's loss (python.steps.loss; NULL when non-finite), nonfinite (the loss or the gradient norm was NaN/Inf) and spike (the agent's spike factor when the loss spiked: python.numerics 'step' rows' note). `probe ui` reads it.
-- params: last
SELECT s.step, s.duration, s.end_time, m.job_mib, m.allocated, m.reserved,
       CASE WHEN isfinite(s.loss) THEN s.loss END AS loss,
       coalesce(NOT isfinite(s.loss), false) OR coalesce(n.nonfinite, false) AS nonfinite,
       n.spike
FROM (SELECT step, duration, end_time, loss FROM python.steps ORDER BY step DESC LIMIT $last) s
LEFT JOIN (SELECT step, any_value(host_mib) AS job_mib, sum(allocated) AS allocated,
                  sum(reserved) AS reserved FROM python.job_memory GROUP BY step) m USING (step)
LEFT JOIN (SELECT step, bool_or(grad_nonfinite) AS nonfinite,
                  max(TRY_CAST(regexp_extract(note, 'spike x([0-9.]+)', 1) AS DOUBLE)) AS spike
           FROM python.numerics WHERE kind = 'step' GROUP BY step) n USING (step)
ORDER BY s.step;
