-- name: schedule
-- description: The LR schedule of this rank as last read (python.schedule): each top-level scheduler with its kind, how it was known (read, measured, opaque), warmup and decay end in scheduler steps, what the LR does past the end, the scheduler's own step count against the optimizer step it was read at, and the total steps the framework declares.
SELECT step, scheduler, location, kind, method, warmup_steps, end_step, after_end, sched_steps,
       total_steps, total_source, framework, note
FROM python.schedule
WHERE step = (SELECT max(step) FROM python.schedule)
ORDER BY scheduler NULLS LAST
