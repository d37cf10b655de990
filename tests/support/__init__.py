"""Shared test support: loopback servers, engine and router factories, the fidelity scenario.

Importable as ``support`` from every test directory because the root ``tests/conftest.py`` puts ``tests/`` on
``sys.path``; the fixtures themselves live in that conftest.
"""
