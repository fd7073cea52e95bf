-- name: step_times_window
-- description: Durations in seconds of this rank's steps that ran wholly between the times $since and $until (epoch seconds): the steps inside a profile or flame window, whose median over the steps before it is the window's cost.
-- params: since, until
SELECT duration FROM python.steps
WHERE start_time >= $since AND end_time <= $until AND duration IS NOT NULL
ORDER BY step;
