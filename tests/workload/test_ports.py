"""The bench's engine ports repeat run to run: a port the previous run left in TIME_WAIT is free again (the
consistent-hash ring hashes worker URLs, so a moved port moves native's placement), and a port a server
still listens on is not."""

from __future__ import annotations

import socket

from progrouter.workload.procs import free_ports_from


def _time_wait_port() -> int:
    """A loopback port whose server side closed a connection first (so it sits in TIME_WAIT) and whose
    listener is gone."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port: int = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        served, _ = listener.accept()
        served.close()  # the server closes first: its side of the connection goes to TIME_WAIT
        client.recv(1)  # the peer sees the end of the stream
        client.close()
    return port


def test_a_port_left_in_time_wait_is_free_again() -> None:
    port = _time_wait_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as plain:  # the probe as it was: refused
        try:
            plain.bind(("127.0.0.1", port))
            in_time_wait = False
        except OSError:
            in_time_wait = True
    assert in_time_wait, "the setup did not leave the port in TIME_WAIT"
    assert free_ports_from(port, 1) == [port]


def test_a_port_with_a_listener_is_skipped() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        ports = free_ports_from(busy, 2)
    assert busy not in ports and len(ports) == 2 and all(p > busy for p in ports)
