-- name: pending_collectives
-- description: Collectives this rank has entered and not finished, oldest first, with how long it has waited. A rank blocked in all_reduce shows one row; run on every rank, ranks missing from the answer are the ones the others wait for.
-- params:
SELECT rank, pg, seq, op, group_ranks, shapes, dtype,
       round(epoch(now()) - start_time, 3) AS waiting_s,
       callsite, thread_name, source
FROM python.collectives
WHERE state = 'pending'
ORDER BY start_time;
