-- name: memory_activations
-- description: The modules that save the most activations for backward, per rank, in its last traced step counted (python.torch_trace.saved_bytes; per forward pass: summed over the step's calls and divided by the root model's calls, so gradient accumulation's micro-batches count once). saved_mib: the module's OWN saved bytes (children's are theirs); share: of all the modules' saved bytes; subtree_mib: with its descendants (by qualified name); input_mib: its tensor arguments; checkpoint_saves_mib: subtree minus inputs, what torch.utils.checkpoint around it would save (it keeps the inputs and recomputes the rest in backward). The top $top by saved_mib and the top $top by checkpoint_saves_mib (depth >= 1: checkpointing the whole model saves nothing) are returned; by_saved / by_checkpoint give each row's places.
-- params: top
WITH s AS (
    SELECT rank, max(step) AS step FROM python.torch_trace
    WHERE saved_bytes IS NOT NULL AND step IN (SELECT step FROM python.torch_trace t2
                                               WHERE t2.stage = 'step')
    GROUP BY rank
),
f AS (
    SELECT t.* FROM python.torch_trace t JOIN s USING (rank, step)
    WHERE t.stage = 'forward' AND NOT coalesce(t.recompute, false)
),
passes AS (
    SELECT rank, greatest(max(n), 1) AS passes
    FROM (SELECT rank, module, count(*) AS n FROM f WHERE depth = 0 GROUP BY ALL) GROUP BY rank
),
m AS (
    SELECT f.rank, any_value(f.step) AS step, f.module, min(f.depth) AS depth, count(*) AS calls,
           sum(f.saved_bytes) / any_value(p.passes) AS own,
           sum(f.input_bytes) / any_value(p.passes) AS inputs
    FROM f JOIN passes p USING (rank) GROUP BY f.rank, f.module
),
tot AS (SELECT rank, sum(own) AS total FROM m GROUP BY rank),
sub AS (
    SELECT a.rank, a.module, sum(b.own) AS subtree
    FROM m a JOIN m b ON a.rank = b.rank
                     AND (b.module = a.module OR starts_with(b.module, a.module || '.'))
    GROUP BY a.rank, a.module
),
r AS (
    SELECT m.rank, m.step, m.module, m.depth, m.calls,
           round(m.own / 2^20, 3) AS saved_mib,
           round(CASE WHEN tot.total > 0 THEN m.own / tot.total END, 4) AS share,
           round(sub.subtree / 2^20, 3) AS subtree_mib,
           round(m.inputs / 2^20, 3) AS input_mib,
           round(greatest(sub.subtree - m.inputs, 0) / 2^20, 3) AS checkpoint_saves_mib,
           row_number() OVER (PARTITION BY m.rank ORDER BY m.own DESC, m.module) AS by_saved,
           row_number() OVER (PARTITION BY m.rank ORDER BY
               CASE WHEN m.depth >= 1 THEN sub.subtree - m.inputs END DESC NULLS LAST,
               m.module) AS by_checkpoint
    FROM m JOIN tot USING (rank) JOIN sub USING (rank, module)
)
SELECT * FROM r WHERE by_saved <= $top OR by_checkpoint <= $top
ORDER BY rank, by_saved
