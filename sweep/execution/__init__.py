"""Running trials on Ray: the runner, the scheduler of warm groups (their placement and start: rank_group; a trial
on one: attempt), placement, and the connection to Ray."""
