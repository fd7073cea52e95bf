-- name: rank_work
-- description: The work each optimizer step of this rank did over its last $last steps (medians), for telling why one rank is slower than the others: samples and tokens per step (python.steps; tokens B x T of the root model's input, or logged), the context length (the latest), DataLoader wait per step (python.step_stats, ms) and host syncs per step (python.host_syncs, 0 for a step with none).
-- params: last
WITH s AS (
    SELECT step, samples, tokens, context_len FROM python.steps WHERE duration IS NOT NULL
    QUALIFY row_number() OVER (ORDER BY step DESC) <= $last
),
syncs AS (
    SELECT s.step, coalesce(sum(h.calls), 0) AS calls
    FROM s LEFT JOIN python.host_syncs h USING (step)
    WHERE s.step > (SELECT min(step) FROM python.steps)
    GROUP BY s.step
)
SELECT count(*) AS steps,
       median(s.samples) AS samples,
       median(s.tokens) AS tokens,
       arg_max(s.context_len, s.step) FILTER (WHERE s.context_len IS NOT NULL) AS context_len,
       round(median(ss.data_wait) * 1e3, 3) AS data_wait_ms,
       (SELECT median(calls) FROM syncs) AS syncs_per_step
FROM s LEFT JOIN python.step_stats ss USING (step)
