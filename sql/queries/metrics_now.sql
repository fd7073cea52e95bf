-- name: metrics_now
-- description: This rank's live numbers, one row per kind (k): 'step' (the last step's duration a and samples_per_s b), 'mem' (per device, from python.job_memory: allocated a, reserved b, peak c, rss d, agent_mib e, and the job's own host memory host_mib f), 'wait' (age of the oldest pending collective a, how many are pending b), 'coll' (seconds in finished collectives a, how many b), 'nonfinite' (steps whose gradient norm was NaN or Inf, a), 'kinds' (per device, the last traced step's memory by kind in MiB: parameters a, gradients b, optimizer state c, activations d, the rest e: job_mib minus the three; the device's capacity f). GET /v1/metrics renders it as Prometheus text.
-- params:
SELECT 'step' AS k, NULL AS device, duration AS a, samples_per_s AS b, NULL AS c, NULL AS d,
       NULL AS e, NULL AS f
  FROM (SELECT * FROM python.steps ORDER BY step DESC LIMIT 1)
UNION ALL
SELECT 'mem', device, allocated, reserved, peak, rss, agent_mib, host_mib
  FROM (SELECT * FROM python.job_memory QUALIFY row_number() OVER (PARTITION BY device
        ORDER BY step DESC, timestamp DESC) = 1)
UNION ALL
SELECT 'wait', NULL, coalesce(max(epoch(now()) - start_time), 0), count(*), NULL, NULL, NULL,
       NULL
  FROM python.collectives WHERE state = 'pending'
UNION ALL
SELECT 'coll', NULL, coalesce(sum(duration), 0), count(*), NULL, NULL, NULL, NULL
  FROM python.collectives WHERE duration IS NOT NULL
UNION ALL
SELECT 'nonfinite', NULL, count(*) FILTER (WHERE NOT isfinite(grad_norm)), NULL, NULL, NULL,
       NULL, NULL FROM python.step_stats
UNION ALL
SELECT 'kinds', device, params_mib, grads_mib, optimizer_mib, activations_mib,
       greatest(job_mib - params_mib - grads_mib - optimizer_mib, 0), capacity_mib
  FROM (SELECT * FROM python.job_memory WHERE params_mib IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY device ORDER BY step DESC, timestamp DESC) = 1);
