"""The live dashboard: its routes and assets (``/dashboard``, the event stream) and the bounded summary of
Ranks and Programs it shows."""
