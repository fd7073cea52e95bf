-- name: numerics_events
-- description: This rank's loss spikes and non-finite steps as the agent captured them (python.numerics 'anomaly' rows: the batch's DataLoader sample indices on the '(total)' row, each module's gradient norm beside the median of its norms on earlier traced steps) and where the first NaN/Inf was born ('origin': module, stage, role, op, samples). `probe doctor` and `probe numerics` name the modules whose gradients jumped and the batch.
-- params:
SELECT e.step, e.module, e.kind, e.grad_norm, e.grad_nonfinite, e.stage, e.role, e.op,
       e.samples, e.note,
       (SELECT median(m.grad_norm) FROM python.numerics m
        WHERE m.kind = 'module' AND m.module = e.module AND m.step < e.step
          AND isfinite(m.grad_norm)) AS baseline
FROM python.numerics e
WHERE e.kind IN ('anomaly', 'origin')
ORDER BY e.step, e.kind, e.module
LIMIT 2000;
