"""The user's config file: settings by their environment names, in TOML, read by every
command and by the local service, below the environment (which overrides it).

MCP hosts start `webctx mcp` with a handful of variables, or none: settings read only
from the environment silently differ between a terminal and a host. The file follows
the user instead. Its place: `WEBCTX_CONFIG_FILE`, else `config.toml` in the platform's
config directory (`~/.config/webctx/config.toml` on Linux). Its keys are the names of
docs/configuration.md (`WEBCTX_SEARXNG_URL = "http://…"`, `OPENAI_API_KEY = "…"`), one
per line, values as strings (numbers, booleans and lists are read as their text).

This module is plain standard library (and platformdirs), its imports deferred to their
use: `webctx research` reads the file before pydantic loads (webctx/cli/handover.py).
`webctx config set` writes it (webctx/cli/config_set.py): one line changed, the others
(comments too) kept, mode 0600 (it may hold a key).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from webctx.errors import ConfigError

CONFIG_FILE_ENV = "WEBCTX_CONFIG_FILE"
"""Where the file is, instead of the platform's config directory (a variable only)."""
HEADER = "# webctx settings: `webctx config set NAME VALUE`; the environment overrides them.\n"

_cache: dict[Path, tuple[tuple[int, int, int], dict[str, str]]] = {}


def config_path(environ: Mapping[str, str] | None = None) -> Path:
    """The config file's path (which may not exist)."""
    environ = os.environ if environ is None else environ
    given = environ.get(CONFIG_FILE_ENV)
    if given:
        return Path(given).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("webctx", appauthor=False)) / "config.toml"


def read_values(path: Path) -> dict[str, str]:
    """The file's settings, names upper-cased, values as environment strings; {} when it
    does not exist. ConfigError naming the file when it is not TOML."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    cached = _cache.get(path)
    if cached is not None and cached[0] == stamp:
        return dict(cached[1])
    values = {name.upper(): _text(value) for name, value in _parse(path).items()}
    _cache[path] = (stamp, values)
    return dict(values)


def _parse(path: Path) -> dict[str, object]:
    import tomllib

    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}; fix or remove it "
                          "(`webctx config path` names it)") from exc  # fmt: skip
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc


def _text(value: object) -> str:
    """A TOML value as the environment would carry it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


def file_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of the config file `environ` names (or the platform's)."""
    return read_values(config_path(environ))


def layered(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` over the config file's values: what a setting read by its name alone
    (the data directory, the broker) resolves to before the settings load. A file that
    does not parse counts as empty here: the settings, once loaded, say why."""
    try:
        values = file_values(environ)
    except ConfigError:
        values = {}
    return {**values, **environ}


def toml_string(value: str) -> str:
    """`value` as a TOML basic string."""
    out = []
    for char in value:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def write_value(path: Path, name: str, value: str | None) -> None:
    """Set `name` to `value` in the file (None: remove it), keeping its other lines; the
    file is created (mode 0600, its folder 0700) if needed and replaced atomically."""
    old = read_values(path)
    text = path.read_text() if path.exists() else HEADER
    edited = _edit_lines(text, name, value)
    expected = {k: v for k, v in old.items() if k != name.upper()}
    if value is not None:
        expected[name.upper()] = value
    if _values_of(edited, path) != expected:
        raise ConfigError(f"config file {path} defines {name} in a way this command does not "
                          "edit (a table or a multi-line value): edit it by hand")  # fmt: skip
    import tempfile

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".toml")
    try:
        with os.fdopen(fd, "w") as handle:  # mkstemp makes it 0600
            handle.write(edited)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _edit_lines(text: str, name: str, value: str | None) -> str:
    """`text` with the top-level line(s) assigning `name` replaced by one (or dropped)."""
    import re

    assigns = re.compile(rf"\s*{re.escape(name)}\s*=", re.IGNORECASE)
    kept: list[str] = []
    table_at: int | None = None
    replaced = value is None
    for line in text.splitlines(keepends=True):
        if table_at is None and line.lstrip().startswith("["):
            table_at = len(kept)
        if table_at is None and assigns.match(line):
            if not replaced:
                kept.append(f"{name} = {toml_string(value or '')}\n")
                replaced = True
            continue
        kept.append(line)
    if not replaced:
        if kept and table_at is None and not kept[-1].endswith("\n"):
            kept[-1] += "\n"
        at = len(kept) if table_at is None else table_at
        kept.insert(at, f"{name} = {toml_string(value or '')}\n")
    return "".join(kept)


def _values_of(text: str, path: Path) -> dict[str, str]:
    import tomllib

    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}; fix it by hand") from exc
    return {key.upper(): _text(value) for key, value in parsed.items()}
