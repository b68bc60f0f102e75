"""`webctx config` and its `set`, `unset` and `path`: the user's config file
(webctx/config_file.py), checked before it is written; and the one-line warnings every
command gives about names that set nothing."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from webctx.cli.common import fail
from webctx.cli.config import (
    config,
    did_you_mean,
    mask_value,
    name_warnings,
    setting_rows,
    validation_problems,
)
from webctx.config_file import CONFIG_FILE_ENV, config_path, read_values, write_value
from webctx.env_names import DEPRECATED_ENV, ConfigFileSource, setting_names
from webctx.errors import ConfigError
from webctx.settings import Settings

config_app = typer.Typer(
    invoke_without_command=True,
    help="The effective settings and where each came from; the user's config file.",
)


@config_app.callback()
def config_main(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per setting.")] = False,
) -> None:
    """Print the effective settings and where each came from (secrets masked)."""
    if ctx.invoked_subcommand is None:
        config(as_json=as_json)

NameArg = Annotated[
    str, typer.Argument(help="A setting's environment name, e.g. WEBCTX_SEARXNG_URL.")
]


@config_app.command("path")
def config_path_cmd() -> None:
    """Print the config file's path (WEBCTX_CONFIG_FILE, else the platform's config folder)."""
    typer.echo(str(config_path()))


@config_app.command("set")
def config_set(
    name: NameArg,
    value: Annotated[str, typer.Argument(help="Its value, as the environment would carry it.")],
) -> None:
    """Set a setting in the config file (read by every command; the environment overrides it)."""
    name = _setting_name(name)
    path = config_path()
    current = _file(path)
    _check_values({**current, name: value}, name)
    _write(path, name, value)
    shown = mask_value(name, value, secret=_is_secret(name))
    typer.echo(f"{name}={shown} written to {path}", err=True)
    if _overridden(name, os.environ):
        typer.echo(f"note: the environment sets {name} too, and overrides the file here", err=True)


@config_app.command("unset")
def config_unset(name: NameArg) -> None:
    """Remove a setting from the config file (it falls back to its default)."""
    path = config_path()
    current = _file(path)
    upper = name.upper()
    if upper not in current:
        _setting_name(name)  # an unknown name: exit 2 with the closest one
        typer.echo(f"{upper} is not set in {path}", err=True)
        return
    _write(path, upper, None)
    typer.echo(f"{upper} removed from {path}", err=True)


def _setting_name(name: str) -> str:
    """`name` upper-cased when it names a setting; else exit 2 saying what it is."""
    upper = name.upper()
    if upper in setting_names(Settings):
        return upper
    if upper in DEPRECATED_ENV:
        raise fail(f"{upper} is deprecated: set {DEPRECATED_ENV[upper]} instead")
    if upper == CONFIG_FILE_ENV:
        raise fail(f"{CONFIG_FILE_ENV} says where the file is: set it in the environment")
    raise fail(f"{upper} is not a webctx setting{did_you_mean(upper)} (`webctx config` lists them)")


def _file(path: Path) -> dict[str, str]:
    try:
        return read_values(path)
    except ConfigError as exc:
        raise fail(str(exc)) from exc


def _check_values(values: Mapping[str, str], name: str) -> None:
    """Exit 2 naming the settings when the file's values, `name`'s new one included, do
    not validate on their own (the environment aside)."""

    class FileOnly(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            del init_settings, env_settings, dotenv_settings, file_secret_settings  # file only
            return (ConfigFileSource(settings_cls, values),)

    try:
        FileOnly()
    except ValidationError as exc:
        raise fail(f"invalid value for {name}: {validation_problems(exc)}") from exc


def _write(path: Path, name: str, value: str | None) -> None:
    try:
        write_value(path, name, value)
    except (ConfigError, OSError) as exc:
        raise fail(str(exc), code=1) from exc


def _is_secret(name: str) -> bool:
    return any(row.secret for row in setting_rows() if row.env == name)


def _overridden(name: str, environ: Mapping[str, str]) -> bool:
    upper = {key.upper() for key in environ}
    return name in upper or any(new == name and old in upper for old, new in DEPRECATED_ENV.items())


def warn_about_names(environ: Mapping[str, str]) -> None:
    """Every command's warnings, once, on stderr (stdout may be an MCP stream): variables
    and config file keys that set nothing. Never fails the command."""
    try:
        lines = name_warnings(environ)
    except Exception:  # noqa: BLE001 - a warning must never break a command
        return
    for line in lines:
        sys.stderr.write(line + "\n")
