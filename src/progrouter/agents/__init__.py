"""Shell-side and still sans-I/O: what every shell (the server's gate, the Envoy picker, the simulator) needs
around the Program scheduler — identity per API body and harness headers, the prompt-size estimate, usage per
response dialect, residency prompt samples, and the one driver that ticks the scheduler and drains its
outcomes. The scheduler never imports these; they import its public surface."""
