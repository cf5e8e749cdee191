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
- A field renamed in a later version keeps its earlier name as an alias,
  `metadata={"aliases": ["--num_candidates"]}`: the alias works as a flag, a YAML key, a
  `make_configs` key and a key of a run's recorded fingerprint (`canonical_keys`), and
  --help says "(alias: --num_candidates)". Both names in one command is an error naming both.
- Values are type-checked at parse time, from flags (argparse) and YAML alike: a YAML
  `batch_size: 2.5` for an int field is a ConfigError naming the file and the field.
- A field's own checks (`__post_init__`) raise ValueError naming the field; parse_configs
  re-raises them as FieldError. ConfigError and FieldError are UserErrors. Unknown flags and values
  argparse cannot convert exit with one error line (code 2).
- A config whose fields take model specs names them in a class attribute (not a field)
  `engine_spec_fields = ("simulator",)`; the CLI then also gets the flags of
  engines.base.ServerOptions (`--request_timeout`, `--max_retries`, `--max_reply_mb`,
  defaults in --help), which become the process's engine defaults.

Entry points run through `run_main(main, argv, prog=...)`: a UserError (or a model
SpecError) is one line on stderr and exit code 2, without a traceback (`--debug` or
SWEET_DEBUG=1 shows it); Ctrl-C is one line saying what was kept, exit code 130
(raise `Interrupted("what was kept; how to resume")` from the KeyboardInterrupt).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
import typing
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from engines.base import ServerOptions, SpecError, set_server_defaults

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class UserError(ValueError):
    """Bad input the user can fix (a flag, a file, a folder): one line, exit code 2."""


class ConfigError(UserError):
    """A flag or --config value that cannot be used: names the file or field and the problem."""


class FieldError(UserError):
    """A config's own check (`__post_init__`) refused a value: names the field."""


class Interrupted(Exception):
    """Ctrl-C, with what was kept and how to resume (one line, exit code 130)."""


def run_main(main: Callable[[Sequence[str]], Any], argv: Sequence[str] | None = None, *, prog: str,
             user_errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run an entry point's `main(argv)`, mapping user errors (UserError, SpecError and the
    entry point's `user_errors`) and a full disk (colbench.io) to one line + exit code 2 and
    Ctrl-C to one line + 130.
    With `--debug` (taken out of argv) or SWEET_DEBUG=1 the traceback is printed before that
    line. Anything else (a bug) raises as usual. Returns main's int result (0 when it
    returns something else)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("SWEET_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    formatwarning = warnings.formatwarning
    if not debug:  # warnings as one line each, like the errors
        warnings.formatwarning = lambda message, category, *args, **kwargs: f"warning: {one_line(message)}\n"
    try:
        result = main(argv)
    except (UserError, SpecError, *user_errors) as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Interrupted as e:
        if debug:
            traceback.print_exc()
        print(f"{prog}: interrupted: {one_line(e)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{prog}: interrupted before any output was written; rerun the command to start", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        from colbench.io import full_disk_line

        line = full_disk_line(e)  # a library's write that met a full disk: one line too
        if line is None:
            raise
        if debug:
            traceback.print_exc()
        print(f"{prog}: error: {line}", file=sys.stderr)
        return EXIT_USER_ERROR
    finally:
        warnings.formatwarning = formatwarning
    return result if isinstance(result, int) else 0


def one_line(e: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(e).split()) or type(e).__name__


class _ExtendList(argparse.Action):
    """`--x a --x b c` -> [a, b, c]; the first use replaces the default (or YAML) list."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = f"_cli_seen_{self.dest}"
        items = list(getattr(namespace, self.dest) or []) if getattr(namespace, seen, False) else []
        setattr(namespace, seen, True)
        setattr(namespace, self.dest, items + list(values))


class _AliasedStore(argparse._StoreAction):
    """A field's store action that refuses its name and one of its aliases in one command."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = f"_cli_name_{self.dest}"
        name = _flag_name(option_string or "")
        first = getattr(namespace, seen, None)
        if first is not None and first != name:
            parser.error(f"--{first} and --{name} name the same setting ({self.dest}); give one of them")
        setattr(namespace, seen, name)
        super().__call__(parser, namespace, values, option_string)


def _flag_name(option: str) -> str:
    """`--num-candidates` -> `num_candidates`: a flag's name whichever spelling was typed."""
    return option.lstrip("-").replace("-", "_")


def aliases(tp: type) -> dict[str, str]:
    """Earlier name -> field name, for the fields of dataclass `tp` that keep one
    (`metadata["aliases"]`, flags like "--num_candidates")."""
    return {_flag_name(a): f.name for f in dataclasses.fields(tp) for a in f.metadata.get("aliases", ())}


def canonical_keys(types: Sequence[type], values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` (settings by name: a YAML file, a saved config, a fingerprint) with each
    key in underscore spelling and each alias renamed to its field name (`aliases`). A
    setting given under two names is a ConfigError naming both and `where`."""
    renamed = {k: v for tp in types for k, v in aliases(tp).items()}
    out: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, value in values.items():
        name = renamed.get(_flag_name(str(key)), _flag_name(str(key)))
        if name in out:
            raise ConfigError(f"{where}: {given[name]!r} and {key!r} name the same setting ({name}); give one of them")
        out[name], given[name] = value, str(key)
    return out


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

    def one_line_error(message: str) -> None:  # argparse prints the whole usage block first
        parser.exit(EXIT_USER_ERROR, f"{parser.prog}: error: {one_line(ValueError(message))} (see --help)\n")

    parser.error = one_line_error  # type: ignore[method-assign]
    has_flag = {s for a in parser._actions for s in a.option_strings}
    aliased = {name for tp in types for name in aliases(tp).values()}
    for action in parser._actions:
        if action.dest in aliased and type(action) is argparse._StoreAction:
            action.__class__ = _AliasedStore
            names = [o for o in action.option_strings if _flag_name(o) != action.dest]
            action.help = f"{action.help or ''} (alias: {', '.join(names)})".strip()
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
    pre = argparse.ArgumentParser(add_help=False, prog=prog)
    pre.add_argument("--config", type=Path, default=None)
    pre.error = lambda message: pre.exit(EXIT_USER_ERROR, f"{pre.prog}: error: {message} (see --help)\n")
    known, _ = pre.parse_known_args(argv)
    server = takes_engine_spec(types)
    all_types = [*types, ServerOptions] if server else list(types)
    parser = make_parser(all_types, description=description, prog=prog)
    if known.config is not None:
        parser.set_defaults(**read_config_file(known.config, all_types))
    ns = parser.parse_args(argv)
    outputs = []
    for tp in all_types:
        names = {f.name for f in dataclasses.fields(tp) if f.init}
        try:
            outputs.append(tp(**{k: v for k, v in vars(ns).items() if k in names}))
        except UserError:
            raise
        except ValueError as e:  # the config's own checks name the field
            raise FieldError(one_line(e)) from e
    if server:
        set_server_defaults(outputs.pop())
    return outputs


def make_configs(types: Sequence[type], values: dict[str, Any] | None = None) -> list[Any]:
    """The programmatic twin of `parse_configs`: one instance per type, each taking the
    `values` whose keys are its field names (a name several types share sets them all, as
    one flag does; an alias names its field, colbench.cli.aliases). A key no type has is an
    error naming it, before any work starts."""
    values = canonical_keys(types, dict(values or {}), "make_configs")
    known = {f.name for tp in types for f in dataclasses.fields(tp) if f.init}
    unknown = sorted(set(values) - known)
    if unknown:
        names = ", ".join(tp.__name__ for tp in types)
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)} for {names}")
    return [tp(**{k: v for k, v in values.items() if k in {f.name for f in dataclasses.fields(tp) if f.init}})
            for tp in types]


def takes_engine_spec(types: Sequence[type]) -> bool:
    """Whether a field of `types` takes a model spec (named in `engine_spec_fields`)."""
    return any(getattr(tp, "engine_spec_fields", ()) for tp in types)


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
    for key, value in canonical_keys(types, data, str(path)).items():
        name = str(key).replace("-", "_")
        if name not in hints:
            raise ConfigError(f"{path}: unknown setting {key!r}")
        if typing.get_origin(_bare(hints[name])) is list and not isinstance(value, list):
            value = [value]  # `agent: reference` means a list of one
        values[name] = check_value(hints[name], value, f"{path}: {key}")
    return values


def check_value(tp: Any, value: Any, where: str) -> Any:
    """`value` (from YAML) as a `tp` field takes it, as a flag's string would be converted:
    ints stay ints (2.5 is refused, "3" is 3), floats take ints and numeric strings
    (YAML reads 1e-5 as a string), strings take numbers, lists check each element.
    ConfigError naming `where` otherwise."""
    if value is None:
        if type(None) in typing.get_args(tp):
            return None
        raise ConfigError(f"{where}: no value (null) given; expected {_type_name(tp)}")
    bare = _bare(tp)
    if typing.get_origin(bare) is list:
        (item,) = typing.get_args(bare) or (str,)
        return [check_value(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if bare is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
    elif bare in (int, float):  # an int where a float is wanted is fine, not the reverse; never a bool
        if isinstance(value, (int, float) if bare is float else int) and not isinstance(value, bool):
            return bare(value)
        if isinstance(value, str):
            try:
                return bare(value)
            except ValueError:
                pass
    elif bare is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        return value  # a type this dialect does not check
    raise ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _type_name(tp: Any) -> str:
    bare = _bare(tp)
    if typing.get_origin(bare) is list:
        return f"a list of {_type_name(typing.get_args(bare)[0])}s"
    name = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(bare, str(bare))
    return name + (" or null" if type(None) in typing.get_args(tp) else "")


def _bare(tp: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if type(None) in typing.get_args(tp) and len(args) == 1:
        return args[0]
    return tp
