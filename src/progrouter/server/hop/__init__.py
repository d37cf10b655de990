"""The worker hop: the pooled HTTP/1.1 client every proxied request goes through, and the decisions around it
(retries, the circuit breaker, worker health), which know the config and each other only."""
