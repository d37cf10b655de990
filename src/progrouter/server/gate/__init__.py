"""The Program shell: the asyncio gate between an HTTP request and the sans-I/O scheduler (on the one Program
driver, ``agents/driver.py``), its Prometheus observer and its KV-event residency; ``contract.py`` is what the
proxy sees of it."""
