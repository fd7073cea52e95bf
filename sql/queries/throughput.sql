-- name: throughput
-- description: Throughput of each rank over its last $last steps (medians; the FLOP-measured step left out of rates): tokens and samples per optimizer step and per second, micro-batches (root calls per step) and context length, FLOPs per step measured (FlopCounterMode) and 6N·tokens, achieved FLOP/s, the peak it is judged against (and its source), MFU; the cost of the measured step against an ordinary one; and where a traced step goes, as shares of its time: forward, backward, optimizer (outermost module of each stage, python.torch_trace), DataLoader wait (python.step_stats), explicit collectives (python.collectives, Python-timed calls inside the step), checkpoint saves and eval intervals (python.step_stats), and the rest (host code outside modules, waits not seen elsewhere; on CUDA, where the stage times are GPU time, the GPU's time outside the model's spans: idle between kernels while the host launches or syncs, or kernels outside modules; on_cuda says which); and the pauses as shares of the wall time of all the window's steps (checkpoint and eval come every few steps, where medians would hide them), with the steps that had one and their mean cost per step (ms); compiled: torch.compile'd frames ran (the FLOPs are then not measured).
-- params: last
WITH s AS (
    SELECT * FROM python.steps WHERE duration IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $last
),
plain AS (SELECT * FROM s WHERE NOT coalesce(flops_measured, false)),
measured AS (
    SELECT rank, arg_max(flops, step) AS flops_measured, arg_max(duration, step) AS measured_s,
           arg_max(step, step) AS measured_step, count(*) AS measurements
    FROM python.steps WHERE flops_measured GROUP BY rank
),
stage AS (  -- per traced step and stage, the outermost module's time (it contains the rest)
    SELECT step, stage, max(d) AS d FROM (
        SELECT step, stage, module, sum(duration) AS d FROM python.torch_trace
        WHERE step IN (SELECT step FROM s WHERE traced) AND NOT coalesce(recompute, false)
          AND depth = 0
        GROUP BY step, stage, module)
    GROUP BY step, stage
),
coll AS (
    SELECT st.step, sum(c.duration) AS d
    FROM s st JOIN python.collectives c
      ON c.start_time >= st.start_time AND c.start_time < st.end_time
    WHERE c.source IN ('python', 'both') AND c.duration IS NOT NULL AND st.traced
    GROUP BY st.step
),
parts AS (
    SELECT st.rank, st.step, st.duration,
           coalesce(max(g.d) FILTER (WHERE g.stage = 'forward'), 0) AS fwd,
           coalesce(max(g.d) FILTER (WHERE g.stage = 'backward'), 0) AS bwd,
           coalesce(max(g.d) FILTER (WHERE g.stage = 'step'), 0) AS opt,
           coalesce(any_value(ss.data_wait), 0) AS data,
           coalesce(any_value(co.d), 0) AS coll,
           coalesce(any_value(ss.ckpt_wait), 0) + coalesce(any_value(ss.eval_wait), 0) AS pause
    FROM s st
    JOIN stage g ON g.step = st.step
    LEFT JOIN python.step_stats ss ON ss.step = st.step
    LEFT JOIN coll co ON co.step = st.step
    WHERE st.traced AND NOT coalesce(st.flops_measured, false)
    GROUP BY st.rank, st.step, st.duration
),
shares AS (
    SELECT rank, count(*) AS traced_steps,
           median(fwd / duration) AS fwd, median(bwd / duration) AS bwd,
           median(opt / duration) AS opt, median(least(data, duration) / duration) AS data,
           median(least(coll, duration) / duration) AS coll,
           median(greatest(duration - fwd - bwd - opt - data - coll - pause, 0) / duration)
               AS other,
           median((fwd + bwd) * 1e3) AS compute_ms
    FROM parts WHERE duration > 0 GROUP BY rank
),
pauses AS (  -- every step of the window: a checkpoint every 10 steps is 10% of the wall time
    SELECT p.rank, sum(coalesce(ss.ckpt_wait, 0)) / nullif(sum(p.duration), 0) AS ckpt,
           sum(coalesce(ss.eval_wait, 0)) / nullif(sum(p.duration), 0) AS eval,
           sum(coalesce(ss.ckpt_wait, 0)) / count(*) AS ckpt_per_step,
           sum(coalesce(ss.eval_wait, 0)) / count(*) AS eval_per_step,
           count(*) FILTER (WHERE ss.ckpt_wait > 0) AS ckpt_steps,
           count(*) FILTER (WHERE ss.eval_wait > 0) AS eval_steps
    FROM plain p LEFT JOIN python.step_stats ss ON ss.step = p.step
    GROUP BY p.rank
),
agg AS (
    SELECT rank, count(*) AS steps, max(step) AS last_step,
           median(duration) AS step_s, median(tokens) AS tokens,
           median(samples) FILTER (WHERE samples IS NOT NULL) AS samples,
           median(tokens_per_s) AS tokens_per_s, median(samples_per_s) AS samples_per_s,
           arg_max(micro_batches, step) FILTER (WHERE micro_batches IS NOT NULL) AS micro_batches,
           arg_max(context_len, step) FILTER (WHERE context_len IS NOT NULL) AS context_len,
           arg_max(tokens_source, step) AS tokens_source,
           median(flops) AS flops, median(flops_6n) AS flops_6n,
           median(flops_per_s) AS flops_per_s, median(mfu) AS mfu,
           arg_max(peak_flops, step) AS peak_flops, arg_max(peak_source, step) AS peak_source,
           arg_max(compute_dtype, step) AS compute_dtype
    FROM plain GROUP BY rank
)
SELECT a.rank, a.steps, a.last_step, round(a.step_s * 1e3, 2) AS step_ms,
       a.tokens, a.samples, round(a.tokens_per_s, 1) AS tokens_per_s,
       round(a.samples_per_s, 2) AS samples_per_s, a.micro_batches, a.context_len,
       a.tokens_source, a.flops, m.flops_measured, a.flops_6n,
       a.flops / nullif(a.tokens, 0) AS flops_per_token,
       a.flops_6n / nullif(a.tokens, 0) AS flops_6n_per_token,
       a.flops_per_s, a.peak_flops, a.peak_source, a.compute_dtype, a.mfu,
       m.measured_step, m.measurements, round(m.measured_s * 1e3, 2) AS measured_step_ms,
       round(m.measured_s / nullif(a.step_s, 0), 2) AS measured_cost_x,
       sh.traced_steps, round(sh.fwd, 4) AS forward_share, round(sh.bwd, 4) AS backward_share,
       round(sh.opt, 4) AS optimizer_share, round(sh.data, 4) AS input_share,
       round(sh.coll, 4) AS collective_share, round(sh.other, 4) AS host_share,
       a.flops / nullif(sh.compute_ms / 1e3, 0) AS compute_flops_per_s,
       round(pz.ckpt, 6) AS checkpoint_share, round(pz.eval, 6) AS eval_share,
       pz.ckpt_steps AS checkpoint_steps, pz.eval_steps,
       round(pz.ckpt_per_step * 1e3, 3) AS checkpoint_ms_per_step,
       round(pz.eval_per_step * 1e3, 3) AS eval_ms_per_step,
       -- on CUDA the stage times are GPU time (CUDA events): host is the GPU outside them
       (SELECT count(*) > 0 FROM python.memory WHERE device LIKE 'cuda%') AS on_cuda,
       -- torch.compile'd frames ran: the FLOP meter stays off (its dispatch mode would make them
       -- recompile or run eagerly), so the FLOPs, FLOP/s and MFU are unknown and this says why
       (SELECT coalesce(max(frames), 0) > 0 FROM python.compile_state) AS compiled
FROM agg a LEFT JOIN measured m USING (rank) LEFT JOIN shares sh USING (rank)
     LEFT JOIN pauses pz USING (rank)
ORDER BY a.rank
