"""What the router tells its operators: Prometheus metrics, logs and their format, traces, and the event feed
the dashboard streams."""
