-- name: collective_summary
-- description: Per process group and op: how many calls, the last seq, failures, and the mean and max time of the calls whose end is known (explicit calls; the Flight Recorder has no end times on gloo).
-- params:
SELECT rank, pg, op,
       count(*) AS calls,
       max(seq) AS last_seq,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       round(avg(duration) * 1e3, 3) AS mean_ms,
       round(max(duration) * 1e3, 3) AS max_ms
FROM python.collectives
GROUP BY rank, pg, op
ORDER BY rank, pg, calls DESC;
