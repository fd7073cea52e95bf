-- name: doctor_comm
-- description: Whether this rank ever communicated: the collectives it recorded (explicit calls and the Flight Recorder's entries, which include DDP's gradient all-reduces), the optimizer steps it recorded and its last step, and the framework that runs the loop (python.schedule's, NULL before it is read). `probe doctor` reads it: ranks of one job that never communicate each train a copy of their own; with the HF Trainer the fix is its arguments, not a DDP wrapper.
-- params:
SELECT (SELECT count(*) FROM python.collectives) AS collectives,
       (SELECT count(*) FROM python.steps)       AS steps,
       (SELECT max(step) FROM python.steps)      AS last_step,
       (SELECT framework FROM python.schedule WHERE framework IS NOT NULL
        ORDER BY timestamp DESC LIMIT 1)         AS framework
