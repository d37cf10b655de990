"""The client edge: what every request crosses before a handler runs (request ids, header hygiene, auth, CORS,
the drain, body deadlines, the admission limiter) and the error shape of each API. Its rules know the config
and each other only; the middleware (``middleware.py``) fixes their order."""
