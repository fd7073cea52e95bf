-- name: steps_outliers
-- description: Steps among the last $last of each rank that took more than $factor times that rank's median step time, slowest first, with whether they were traced (then `probe slow` or the timeline shows where the time went).
-- params: last, factor, limit
WITH s AS (
    SELECT * FROM python.steps WHERE duration IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY step DESC) <= $last
),
med AS (SELECT rank, median(duration) AS med FROM s GROUP BY rank)
SELECT rank, step, round(duration * 1e3, 2) AS ms, round(duration / med, 2) AS x_median,
       traced, to_timestamp(end_time) AS ended
FROM s JOIN med USING (rank)
WHERE duration > $factor * med
QUALIFY row_number() OVER (PARTITION BY rank ORDER BY duration DESC) <= $limit
ORDER BY rank, duration DESC;
