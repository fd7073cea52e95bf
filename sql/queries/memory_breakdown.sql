-- name: memory_breakdown
-- description: Where each rank's memory goes, from its last $last traced steps (medians, MiB): parameters, gradients and optimizer state this rank holds (the local shard under FSDP2), activations saved for backward in a step's largest forward pass, and the rest (CUDA: allocated minus the three, as the allocator saw it after the step; CPU: the job's memory, python.job_memory's job_mib, minus the three: on CPU that includes the interpreter and torch's libraries). total_mib = the five: about the step's peak, since activations are freed by the time the row is taken. On CUDA also allocated, reserved, the allocator's peak and the device's capacity. params_fp32_mib: the float32 part of the parameters; sharded: parameters are DTensors (FSDP2). params_bytes, grads_bytes, optimizer_bytes, activations_bytes: the same medians in exact bytes (the _mib columns are rounded to 0.01 MiB). compiled: torch.compile compiled frames on this rank (python.compile_state): activations are then not counted (NULL), since the hooks that count them would be traced into the compiled graphs.
-- params: last
WITH m AS (
    SELECT *, job_mib AS job FROM python.job_memory WHERE params_mib IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY rank, device ORDER BY step DESC) <= $last
),
k AS (
    SELECT rank, device, max(step) AS step, count(*) AS traced_steps,
           median(params_mib) AS params, median(grads_mib) AS grads,
           median(optimizer_mib) AS optim, median(activations_mib) AS act,
           median(job) AS job, median(params_fp32_mib) AS p32, bool_or(sharded) AS sharded,
           median(allocated) AS allocated, median(reserved) AS reserved, max(peak) AS peak,
           any_value(capacity_mib) AS capacity
    FROM m GROUP BY rank, device
),
c AS (
    SELECT rank, bool_or(coalesce(frames, 0) > 0 OR coalesce(compiled_root, false)) AS compiled
    FROM python.compile_state GROUP BY rank
),
kc AS (  -- under compile the counting hooks are off: a value from before it is no measure
    SELECT k.* REPLACE (CASE WHEN coalesce(c.compiled, false) THEN NULL ELSE k.act END AS act),
           coalesce(c.compiled, false) AS compiled
    FROM k LEFT JOIN c USING (rank)
)
SELECT rank, device, step, traced_steps,
       round(params, 2) AS params_mib, round(grads, 2) AS grads_mib,
       round(optim, 2) AS optimizer_mib, round(act, 2) AS activations_mib,
       round(greatest(job - params - grads - optim, 0), 2) AS other_mib,
       round(params + grads + optim + coalesce(act, 0)
             + greatest(job - params - grads - optim, 0), 2) AS total_mib,
       round(job, 2) AS job_mib, round(p32, 2) AS params_fp32_mib, sharded,
       round(allocated, 2) AS allocated_mib, round(reserved, 2) AS reserved_mib,
       round(peak, 2) AS peak_mib, round(capacity, 1) AS capacity_mib,
       CAST(round(params * 1048576) AS BIGINT) AS params_bytes,
       CAST(round(grads * 1048576) AS BIGINT) AS grads_bytes,
       CAST(round(optim * 1048576) AS BIGINT) AS optimizer_bytes,
       CAST(round(act * 1048576) AS BIGINT) AS activations_bytes, compiled
FROM kc ORDER BY rank, device
