"""`progrouter serve`: the aiohttp shell. Here the app, its state, the front door, the proxy and the admin and
status routes; by job, ``edge/`` (the client side), ``hop/`` (the worker side), ``gate/`` (the Program shell),
``telemetry/`` and ``dashboard/``."""
