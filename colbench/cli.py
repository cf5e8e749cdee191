"""The one command-line dialect of every entry point (evaluate, trainers, demos).

    configs = parse_configs([ModelConfig, TrainConfig], argv)    # one instance per dataclass

- Each dataclass field is a flag, accepted as `--output_dir` and `--output-dir`
  (transformers' HfArgumentParser builds the parser from the fields' types, defaults
  and `metadata["help"]`).
- Booleans: `--lora`, `--lora true`, `--lora false`, `--no-lora` (or `--no_lora`).
- Lists (`list[str]`): repeat the flag (`--agent a --agent b`) or give several values
  (`--agent a b`); the flags replace the default or YAML list, they do not add to it.
- `--config run.yaml` supplies defaults that flags override (TRL style); its keys are
  field names in either spelling, and an unknown key is an error naming the file.
- A field's own checks (`__post_init__`) raise ValueError naming the field; a bad
  config file raises ConfigError (a ValueError). Unknown flags exit with usage (code 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any, Sequence


class ConfigError(ValueError):
    """A --config file that cannot be used: names the file and the problem."""


class _ExtendList(argparse.Action):
    """`--x a --x b c` -> [a, b, c]; the first use replaces the default (or YAML) list."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = f"_cli_seen_{self.dest}"
        items = list(getattr(namespace, self.dest) or []) if getattr(namespace, seen, False) else []
        setattr(namespace, seen, True)
        setattr(namespace, self.dest, items + list(values))


def make_parser(types: Sequence[type], *, description: str | None = None, prog: str | None = None,
                **kwargs: Any) -> argparse.ArgumentParser:
    """The parser for some dataclass configs, with `--config` (see the module docstring)."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(list(types), description=description, prog=prog, **kwargs)
    parser.add_argument("--config", type=Path, default=None, metavar="RUN.yaml",
                        help="YAML file of defaults; flags override it")
    bools, lists = set(), set()
    for tp in types:
        hints = typing.get_type_hints(tp)
        for f in dataclasses.fields(tp):
            if _bare(hints[f.name]) is bool:
                bools.add(f.name)
            elif typing.get_origin(_bare(hints[f.name])) is list:
                lists.add(f.name)
    has_flag = {s for a in parser._actions for s in a.option_strings}
    for action in parser._actions:
        if action.dest in lists:
            action.__class__ = _ExtendList  # same constructor arguments as the store action it replaces
        if action.dest in bools and action.const is True and f"--no_{action.dest}" not in has_flag:
            # HfArgumentParser adds --no_x only for fields defaulting to True; every bool gets it here
            parser.add_argument(f"--no_{action.dest}", f"--no-{action.dest.replace('_', '-')}",
                                action="store_false", dest=action.dest, help=argparse.SUPPRESS)
    return parser


def parse_configs(types: Sequence[type], argv: Sequence[str] | None = None, *, description: str | None = None,
                  prog: str | None = None) -> list[Any]:
    """Parse dataclass configs from `argv` (default sys.argv[1:]); one instance per type."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", type=Path, default=None)
    known, _ = pre.parse_known_args(argv)
    parser = make_parser(types, description=description, prog=prog)
    if known.config is not None:
        parser.set_defaults(**read_config_file(known.config, types))
    ns = parser.parse_args(argv)
    outputs = []
    for tp in types:
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        outputs.append(tp(**{k: v for k, v in vars(ns).items() if k in names}))
    return outputs


def make_configs(types: Sequence[type], values: dict[str, Any] | None = None) -> list[Any]:
    """The programmatic twin of `parse_configs`: one instance per type, each taking the
    `values` whose keys are its field names (a name several types share sets them all, as
    one flag does). A key no type has is an error naming it, before any work starts."""
    values = dict(values or {})
    known = {f.name for tp in types for f in dataclasses.fields(tp) if f.init}
    unknown = sorted(set(values) - known)
    if unknown:
        names = ", ".join(tp.__name__ for tp in types)
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)} for {names}")
    return [tp(**{k: v for k, v in values.items() if k in {f.name for f in dataclasses.fields(tp) if f.init}})
            for tp in types]


def read_config_file(path: Path, types: Sequence[type]) -> dict[str, Any]:
    """A YAML mapping of field names (either spelling) to values, checked against `types`."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config: file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    hints = {f.name: typing.get_type_hints(tp)[f.name] for tp in types for f in dataclasses.fields(tp)}
    values = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in hints:
            raise ConfigError(f"{path}: unknown setting {key!r}")
        if typing.get_origin(_bare(hints[name])) is list and not isinstance(value, list):
            value = [value]  # `agent: reference` means a list of one
        values[name] = value
    return values


def _bare(tp: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if type(None) in typing.get_args(tp) and len(args) == 1:
        return args[0]
    return tp
