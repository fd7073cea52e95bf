-- name: moe_load
-- description: Load of each MoE layer's experts over the last $last sampled steps of each rank (python.moe_load): tokens per expert summed over those steps, its share of the layer's tokens, the steps sampled, the layer's experts and k, dead (no token in any of those steps), the layer's max-to-ideal ratio (the busiest expert's tokens / the mean over experts: 1 is even, experts is all on one) and, with expert parallelism, the global rank that holds the expert (owner; NULL when every rank holds every expert).
-- params: last
WITH recent AS (
    SELECT rank, step FROM (SELECT DISTINCT rank, step FROM python.moe_load)
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $last
),
per AS (
    SELECT m.rank, m.layer, m.expert, sum(m.tokens) AS tokens, any_value(m.experts) AS experts,
           any_value(m.top_k) AS top_k, count(DISTINCT m.step) AS steps,
           any_value(m.owner) AS owner
    FROM python.moe_load m SEMI JOIN recent USING (rank, step)
    GROUP BY m.rank, m.layer, m.expert
)
SELECT rank, layer, expert, tokens,
       round(tokens / nullif(sum(tokens) OVER (PARTITION BY rank, layer), 0), 4) AS share,
       steps, experts, top_k, tokens = 0 AS dead,
       round(max(tokens) OVER (PARTITION BY rank, layer)
             / nullif(avg(tokens) OVER (PARTITION BY rank, layer), 0), 3) AS max_to_ideal,
       owner
FROM per
ORDER BY rank, layer, expert
