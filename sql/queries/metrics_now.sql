-- name: metrics_now
-- description: This rank's live numbers, one row per kind (k): 'step' (the last step's duration a, samples_per_s b, loss c, and total gradient norm d from python.numerics), 'mem' (per device, from python.job_memory: allocated a, reserved b, peak c, rss d, agent_mib e, and the job's own host memory host_mib f), 'wait' (age of the oldest pending collective a, how many are pending b), 'coll' (seconds in finished collectives a, how many b), 'nonfinite' (steps whose gradient norm or loss was NaN or Inf, a: python.numerics, else clip_grad_norm_'s norm in python.step_stats), 'kinds' (per device, the last traced step's memory by kind in MiB: parameters a, gradients b, optimizer state c, activations d, the rest e: job_mib minus the three; the device's capacity f). GET /v1/metrics renders it as Prometheus text.
-- params:
SELECT 'step' AS k, NULL AS device, duration AS a, samples_per_s AS b, loss AS c,
       (SELECT grad_norm FROM python.numerics n WHERE n.kind = 'step' AND n.step = s.step
        LIMIT 1) AS d, NULL AS e, NULL AS f
  FROM (SELECT * FROM python.steps ORDER BY step DESC LIMIT 1) s
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
SELECT 'nonfinite', NULL, greatest(
         (SELECT count(*) FILTER (WHERE NOT isfinite(grad_norm)) FROM python.step_stats),
         (SELECT count(*) FILTER (WHERE grad_nonfinite) FROM python.numerics
          WHERE kind = 'step')), NULL, NULL, NULL, NULL, NULL
UNION ALL
SELECT 'kinds', device, params_mib, grads_mib, optimizer_mib, activations_mib,
       greatest(job_mib - params_mib - grads_mib - optimizer_mib, 0), capacity_mib
  FROM (SELECT * FROM python.job_memory WHERE params_mib IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY device ORDER BY step DESC, timestamp DESC) = 1);
