"""Every option of a command also from the environment and from a config file.

An option ``--max-sessions-per-client`` is also ``REALTIME_MAX_SESSIONS_PER_CLIENT`` in the
environment and ``max-sessions-per-client`` (or ``max_sessions_per_client``) in the file named
by ``--config``. Precedence, highest first::

    flag on the command line  >  REALTIME_* variable  >  config file  >  the option's default

Nothing here knows an option by name: the layers are read off the parser's actions, and each
value goes through the option's own argparse ``type`` and ``choices``, so ``REALTIME_PORT=99999``
is refused with the words ``--port 99999`` gets. A bad value is one ``SettingsError`` line that
names where it came from (``REALTIME_PORT: ...``, ``serve.toml: port: ...``).

Text from the environment: a flag (``--no-tts``) takes 1/0, true/false, yes/no; a repeatable
option (``--api-key``) takes its values separated by commas. The file's own types are used
as text (``port = 8080``, ``no-tts = true``); a list is one value per item for a repeatable
option and comma-joined for the others (``allowed-origins = ["https://a", "https://b"]``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import tomllib
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping

ENV_PREFIX = "REALTIME_"
# REALTIME_* variables of this project that are not server options: the piper voice's
# conversion cache (models/tts/piper/convert.py). Any other REALTIME_* is taken for a
# misspelled option and refused: a REALTIME_API_KEYS quietly ignored would leave the server open.
OTHER_VARIABLES = frozenset({"REALTIME_CACHE_DIR"})

TRUE = frozenset({"1", "true", "yes"})
FALSE = frozenset({"0", "false", "no"})
REDACTED = "<redacted>"


class SettingsError(ValueError):
    """A value the environment or the config file gave that the option refuses (one line)."""


@dataclass(frozen=True)
class Setting:
    """One option's resolved value and where it came from."""

    name: str  # the long flag without its dashes: "max-batch"
    dest: str  # the namespace attribute: "max_batch"
    value: Any
    source: str  # "flag", "env", "file" or "default"
    origin: str = ""  # the variable (env) or the file's path (file)

    def shown_source(self) -> str:
        return f"{self.source} {self.origin}" if self.origin else self.source


@dataclass(frozen=True)
class Resolved:
    args: argparse.Namespace
    settings: tuple[Setting, ...]  # every option, in the parser's order


def option_name(action: argparse.Action) -> str:
    """``--max-batch`` -> ``max-batch`` (the first long flag)."""
    return next(s for s in action.option_strings if s.startswith("--"))[2:]


def env_name(action: argparse.Action) -> str:
    """``--max-batch`` -> ``REALTIME_MAX_BATCH``."""
    return ENV_PREFIX + option_name(action).replace("-", "_").upper()


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's settable options (not --help, --version or positionals)."""
    return [a for a in parser._actions
            if a.default is not argparse.SUPPRESS and any(s.startswith("--") for s in a.option_strings)]


def resolve(parser: argparse.ArgumentParser, command: argparse.ArgumentParser, argv: list[str] | None,
            environ: Mapping[str, str], *, config_dest: str, flag_only: Collection[str] = (),
            secret: Collection[str] = ()) -> Resolved:
    """Parse ``argv`` with ``parser`` and fill ``command``'s options that no flag gave from
    ``environ``, then from the file named by the ``config_dest`` option (a flag or its variable).

    ``flag_only`` options come from the command line alone; ``secret`` ones never have their
    value in an error. argparse's own errors (and --help) exit as usual; a bad value from the
    environment or the file raises ``SettingsError``, even where a flag overrides it.
    """
    args = parser.parse_args(argv)
    actions = options(command)
    given = _given(parser, argv, actions)
    from_env = _environment(environ, actions, flag_only)
    config = getattr(args, config_dest) if config_dest in given else None
    if config is None and config_dest in from_env:
        config = from_env[config_dest][1]
    from_file = _file(config, actions, {*flag_only, config_dest}) if config else {}
    settings = []
    for action in actions:
        dest, name = action.dest, option_name(action)
        # Every value given is checked, the ones a higher layer overrides too: a bad
        # variable is reported now, not on the day the flag that hid it is dropped.
        layers = [Setting(name, dest, getattr(args, dest), "flag")] if dest in given else []
        if dest in from_env:
            variable, text = from_env[dest]
            layers.append(Setting(name, dest, convert(action, text, variable, dest in secret), "env", variable))
        if dest in from_file:
            key, raw = from_file[dest]
            value = convert(action, raw, f"{config}: {key}", dest in secret)
            layers.append(Setting(name, dest, value, "file", config))
        setting = layers[0] if layers else Setting(name, dest, getattr(args, dest), "default")
        setattr(args, dest, setting.value)
        settings.append(setting)
    return Resolved(args, tuple(settings))


def convert(action: argparse.Action, raw: Any, where: str, secret: bool = False) -> Any:
    """``raw`` (text from the environment, or a value from a file) as ``action``'s flag would
    parse it; ``SettingsError`` naming ``where`` if the option refuses it."""
    if raw is None or isinstance(raw, dict):
        raise SettingsError(f"{where}: not a value (leave it out for the default)")
    if action.nargs == 0:  # --no-tts: a flag that stores its const
        word = _text(raw).strip().lower()
        if word in TRUE:
            return action.const
        if word in FALSE:
            return action.default
        raise SettingsError(f"{where}: want 1/0, true/false or yes/no, got {_shown(raw, secret)}")
    if isinstance(action, argparse._AppendAction):  # --api-key KEY, repeatable
        items = raw if isinstance(raw, list) else [s for s in str(raw).split(",") if s.strip()]
        return [_typed(action, _text(item).strip(), where, secret) for item in items]
    return _typed(action, _text(raw), where, secret)


def render(settings: Iterable[Setting], secret: Collection[str] = ()) -> str:
    """One line per setting, ``name = value  # source``; ``secret`` values are redacted."""
    lines = []
    for s in settings:
        if s.dest in secret:
            value = [REDACTED] * len(s.value) if isinstance(s.value, (list, tuple)) else (s.value and REDACTED)
        else:
            value = s.value
        lines.append((f"{s.name} = {_json(value)}", s.shown_source()))
    width = max(len(left) for left, _ in lines)
    return "\n".join(f"{left:<{width}}  # {source}" for left, source in lines)


def load_file(path: str) -> dict[str, Any]:
    """The mapping a TOML, JSON or YAML (with PyYAML installed) config file holds."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in (".toml", ".json", ".yaml", ".yml"):
        raise SettingsError(f"{path}: unknown config format {ext or '(no extension)'!r}: "
                            "want .toml, .json, .yaml or .yml")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SettingsError(f"{path}: {exc.strerror or exc}") from None
    try:
        if ext == ".toml":
            loaded: Any = tomllib.loads(data.decode())
        elif ext == ".json":
            loaded = json.loads(data)
        else:
            loaded = _yaml(path, data)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: {_one_line(exc)}") from None
    if loaded is None:  # an empty YAML file
        return {}
    if not isinstance(loaded, dict):
        raise SettingsError(f"{path}: want a table of option names, got a {type(loaded).__name__}")
    return loaded


def _yaml(path: str, data: bytes) -> Any:
    try:
        import yaml
    except ImportError:
        raise SettingsError(f"{path}: a YAML config needs PyYAML, which is not installed: "
                            "pip install pyyaml, or write the file as TOML or JSON") from None
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{path}: {_one_line(exc)}") from None


def _given(parser: argparse.ArgumentParser, argv: list[str] | None, actions: list[argparse.Action]) -> set[str]:
    """The options a flag on the command line gave: with no defaults, only they are set."""
    saved = {action: action.default for action in actions}
    for action in actions:
        action.default = argparse.SUPPRESS
    try:
        return set(vars(parser.parse_args(argv))) & {a.dest for a in actions}
    finally:
        for action, default in saved.items():
            action.default = default


def _environment(environ: Mapping[str, str], actions: list[argparse.Action],
                 flag_only: Collection[str]) -> dict[str, tuple[str, str]]:
    """dest -> (variable, text) for each REALTIME_* option variable; unknown ones refused."""
    by_name = {env_name(a): a for a in actions}
    found = {}
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable in OTHER_VARIABLES:
            continue
        action = by_name.get(variable)
        if action is None:
            raise SettingsError(f"{variable}: not an option{_did_you_mean(variable, by_name)}")
        if action.dest in flag_only:
            raise SettingsError(f"{variable}: --{option_name(action)} is a command-line flag only")
        found[action.dest] = (variable, environ[variable])
    return found


def _file(path: str, actions: list[argparse.Action], not_in_file: Collection[str]) -> dict[str, tuple[str, Any]]:
    """dest -> (key, value) for each key of the config file; unknown keys refused."""
    by_name = {option_name(a): a for a in actions}
    found: dict[str, tuple[str, Any]] = {}
    for key, value in load_file(path).items():
        action = by_name.get(str(key).replace("_", "-"))
        if action is None:
            raise SettingsError(f"{path}: {key}: not an option{_did_you_mean(str(key), by_name)}")
        if action.dest in not_in_file:
            raise SettingsError(f"{path}: {key}: not an option of a config file")
        if action.dest in found:
            raise SettingsError(f"{path}: {key}: given twice (as {found[action.dest][0]} too)")
        found[action.dest] = (key, value)
    return found


def _typed(action: argparse.Action, text: str, where: str, secret: bool) -> Any:
    """``text`` through the option's ``type`` and ``choices``, as argparse checks a flag."""
    try:
        value = action.type(text) if callable(action.type) else text
    except argparse.ArgumentTypeError as exc:
        raise SettingsError(f"{where}: {REDACTED if secret else exc}") from None
    except (TypeError, ValueError):
        kind = getattr(action.type, "__name__", "").strip("_") or "a"
        raise SettingsError(f"{where}: invalid {kind} value: {_shown(text, secret)}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(repr, action.choices))
        raise SettingsError(f"{where}: invalid choice: {_shown(text, secret)} (choose from {choices})")
    return value


def _text(raw: Any) -> str:
    """A file's value as the text a flag would carry."""
    if isinstance(raw, bool):
        return "true" if raw else "false"
    if isinstance(raw, list):
        return ",".join(_text(item) for item in raw)
    return str(raw)


def _shown(raw: Any, secret: bool) -> str:
    return REDACTED if secret else repr(raw)


def _json(value: Any) -> str:
    try:
        return json.dumps(value)
    except TypeError:
        return json.dumps(str(value))


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
