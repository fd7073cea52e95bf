-- name: step_times_before
-- description: Durations in seconds of this rank's last $last steps up to step $step that ended by the time $until (epoch seconds): the baseline a profile or flame window's cost is measured against.
-- params: step, until, last
SELECT duration FROM python.steps
WHERE step <= $step AND end_time <= $until AND duration IS NOT NULL
ORDER BY step DESC
LIMIT $last;
