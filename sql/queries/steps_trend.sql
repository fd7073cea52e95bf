-- name: steps_trend
-- description: Step time over the last $last steps of each rank: median, p90 and max (ms), the median of the older half against the newer half (trend_pct > 0: getting slower), samples/s, and how many steps took more than 2x the median.
-- params: last
WITH s AS (
    SELECT *, row_number() OVER (PARTITION BY rank ORDER BY step DESC) AS age
    FROM python.steps WHERE duration IS NOT NULL
    QUALIFY age <= $last
),
half AS (SELECT rank, max(age) AS n FROM s GROUP BY rank)
SELECT rank, count(*) AS steps, min(step) AS first_step, max(step) AS last_step,
       round(median(duration) * 1e3, 2) AS median_ms,
       round(quantile_cont(duration, 0.9) * 1e3, 2) AS p90_ms,
       round(max(duration) * 1e3, 2) AS max_ms,
       round(100 * (median(duration) FILTER (WHERE age <= n / 2)
             / nullif(median(duration) FILTER (WHERE age > n / 2), 0) - 1), 1) AS trend_pct,
       round(median(samples_per_s), 1) AS samples_per_s,
       count(*) FILTER (WHERE duration > 2 * (SELECT median(duration) FROM s s2
                                               WHERE s2.rank = s.rank)) AS outliers
FROM s JOIN half USING (rank)
GROUP BY rank
ORDER BY rank;
