-- name: module_flops
-- description: Where the last FLOP-measured step's tensor work ran, per module (python.module_flops): its FLOPs and share of the step's FLOPs, aten ops, host time inside them (ms), and the step's totals (all_flops, all_ops, all_op_ms). module NULL: ops outside any module's forward (backward, optimizer, loss). Read beside the slowest modules' time: a module with much time and almost no FLOPs or op time waits on host code in its forward.
-- params:
WITH last AS (SELECT rank, max(step) AS step FROM python.module_flops GROUP BY rank),
w AS (SELECT f.* FROM python.module_flops f SEMI JOIN last USING (rank, step))
SELECT rank, step, module, flops, ops, round(op_ms, 3) AS op_ms,
       sum(flops) OVER (PARTITION BY rank) AS all_flops,
       sum(ops) OVER (PARTITION BY rank) AS all_ops,
       round(sum(op_ms) OVER (PARTITION BY rank), 3) AS all_op_ms,
       round(flops / nullif(sum(flops) OVER (PARTITION BY rank), 0), 6) AS flops_share
FROM w
ORDER BY rank, flops DESC NULLS LAST, module
