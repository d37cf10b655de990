"""Emulator defaults matching the router's capacity: the loopback tier's fixture, shared."""

from integration.conftest import engine_defaults

__all__ = ["engine_defaults"]
