"""Where a router's settings come from: flags win over environment variables, which win over a config file.

Every ``RouterConfig`` field can be set three ways besides its default: a YAML or JSON file (``--config``,
keys are field names), an environment variable ``PROGROUTER_<FIELD>`` (lists and objects as JSON), and a
flag. The merged mapping is validated once by ``RouterConfig``, so an unknown key in the file is an error
that names it, exactly like a misspelt knob in ``--program-scheduling-config-json``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import EnvSettingsSource

from progrouter.config import ConfigError, RouterConfig, parse_config

ENV_PREFIX = "PROGROUTER_"


def read_config_file(path: str) -> dict[str, Any]:
    """The mapping in a YAML or JSON file (JSON is YAML); a clear ConfigError for anything else."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML or JSON: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(f"config file {path} must hold a mapping of setting names to values")
    return data


def read_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``PROGROUTER_<FIELD>`` variables of ``environ`` (the process environment by default)."""
    source = EnvSettingsSource(RouterConfig, env_prefix=ENV_PREFIX, case_sensitive=False)  # type: ignore[arg-type]
    if environ is not None:
        source.env_vars = {k.lower(): v for k, v in environ.items()}
    try:
        return dict(source())
    except Exception as exc:  # pydantic-settings raises SettingsError for a malformed JSON value
        raise ConfigError(f"environment: {exc}") from exc


def load_router_config(
    flags: Mapping[str, Any],
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> RouterConfig:
    """The RouterConfig of file < environment < ``flags`` (only the flags given on the command line)."""
    data: dict[str, Any] = read_config_file(config_file) if config_file is not None else {}
    data.update(read_environment(os.environ if environ is None else environ))
    data.update(flags)
    origin = "router settings" if config_file is None else f"router settings (config file {config_file})"
    return parse_config(RouterConfig, data, prefix=origin)
