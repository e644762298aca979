"""How warmgate's pydantic-settings models read their sources, written once for the gateway
(`gateway.config.settings.Settings`) and tierd (`tierd.settings.TierdSettings`):

- `sources(settings_cls, init, env, yaml_file)`: the precedence, highest first: explicit
  arguments (keywords, CLI flags), the environment, the YAML file, the defaults.
- `check_env(settings_cls, prefix=...)`: every environment variable under the model's prefix
  must name one of its fields (or be on the caller's list of names other parts read), or it
  is refused with an `UnknownEnvironmentError` (a `ConfigurationError`) naming it and the
  closest valid name; a misspelt variable is never silently ignored. Nested keys
  (`WARMGATE_HEALTH__HELTH`) are the models' own `extra="forbid"`'s to refuse; this checks
  the first part of the name.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Mapping
from pathlib import Path

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, YamlConfigSettingsSource

from contracts.errors import ConfigurationError


class UnknownEnvironmentError(ConfigurationError, ValueError):
    """An environment variable under a settings prefix names no setting (a ValueError, as a
    settings validation error is, so `warmgate serve` reports it as bad configuration)."""


class ConfigFileMissingError(ConfigurationError, FileNotFoundError):
    """The YAML file the settings were pointed at does not exist."""


def sources(
    settings_cls: type[BaseSettings],
    init_settings: PydanticBaseSettingsSource,
    env_settings: PydanticBaseSettingsSource,
    yaml_file: str | Path | None,
) -> tuple[PydanticBaseSettingsSource, ...]:
    """The sources in precedence order: arguments, environment, YAML file (when given)."""
    if yaml_file is None:
        return (init_settings, env_settings)
    if not Path(yaml_file).is_file():
        raise ConfigFileMissingError(f"config file {yaml_file} not found")
    return (
        init_settings,
        env_settings,
        YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file),
    )


def unknown_env(
    settings_cls: type[BaseSettings],
    *,
    prefix: str,
    nested_delimiter: str | None = None,
    allowed: Collection[str] = (),
    allowed_prefixes: Collection[str] = (),
    environ: Mapping[str, str] | None = None,
) -> list[tuple[str, str | None]]:
    """(variable, closest valid name or None) for each variable under `prefix` that names
    no field of `settings_cls`. `allowed` and `allowed_prefixes` are the rest of the name
    after `prefix` (upper case) of variables other parts read."""
    env = os.environ if environ is None else environ
    fields = {name.upper() for name in settings_cls.model_fields}
    valid = sorted(fields | {name.upper() for name in allowed})
    out: list[tuple[str, str | None]] = []
    for name in sorted(env):
        upper = name.upper()
        if not upper.startswith(prefix):
            continue
        rest = upper[len(prefix) :]
        head, sep, tail = rest.partition(nested_delimiter) if nested_delimiter else (rest, "", "")
        if head in fields or rest in allowed or any(rest.startswith(p) for p in allowed_prefixes):
            continue
        close = difflib.get_close_matches(head, valid, n=1)
        out.append((name, f"{prefix}{close[0]}{sep}{tail}" if close else None))
    return out


def check_env(
    settings_cls: type[BaseSettings],
    *,
    prefix: str,
    nested_delimiter: str | None = None,
    allowed: Collection[str] = (),
    allowed_prefixes: Collection[str] = (),
    environ: Mapping[str, str] | None = None,
) -> None:
    """Raise `UnknownEnvironmentError` naming every unknown variable under `prefix` (see
    `unknown_env`) and the closest valid name of each."""
    unknown = unknown_env(
        settings_cls,
        prefix=prefix,
        nested_delimiter=nested_delimiter,
        allowed=allowed,
        allowed_prefixes=allowed_prefixes,
        environ=environ,
    )
    if not unknown:
        return
    parts = [f"{name} (did you mean {close}?)" if close else name for name, close in unknown]
    raise UnknownEnvironmentError(
        f"unknown environment variable{'s' if len(parts) > 1 else ''} for "
        f"{settings_cls.__name__}: {', '.join(parts)}"
    )
