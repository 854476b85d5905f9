"""Running trials on Ray: the runner, the scheduler of warm groups, placement, and the connection to Ray."""
