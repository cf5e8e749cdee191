"""The one CLI dialect (colbench.cli): both flag spellings, booleans, lists, --config."""

from dataclasses import dataclass, field

import pytest

from colbench.cli import ConfigError, make_configs, parse_configs


@dataclass
class RunConfig:
    output_dir: str = field(default="runs/x", metadata={"help": "where outputs go"})
    max_new_tokens: int = 16
    temperature: float | None = None
    agent: list[str] = field(default_factory=list)


@dataclass
class FlagConfig:
    lora: bool = False
    progress: bool = True

    def __post_init__(self):
        if self.lora and not self.progress:
            raise ValueError("FlagConfig.lora needs progress")


def parse(argv):
    return parse_configs([RunConfig, FlagConfig], argv)


@pytest.mark.parametrize("flag", ["--output_dir", "--output-dir"])
def test_both_spellings(flag):
    run, _ = parse([flag, "o", "--max-new-tokens", "3", "--max_new_tokens", "5"])
    assert (run.output_dir, run.max_new_tokens) == ("o", 5)  # the later flag wins, whatever its spelling


@pytest.mark.parametrize("argv, lora, progress", [
    ([], False, True), (["--lora"], True, True), (["--lora", "true"], True, True),
    (["--lora", "false"], False, True), (["--no-progress"], False, False), (["--no_progress"], False, False),
    (["--progress", "false"], False, False), (["--lora", "--no-lora"], False, True),
])
def test_booleans(argv, lora, progress):
    _, flags = parse(argv)
    assert (flags.lora, flags.progress) == (lora, progress)


def test_lists_repeat_or_take_several_values_and_replace_the_default(tmp_path):
    assert parse(["--agent", "a", "--agent", "b", "c"])[0].agent == ["a", "b", "c"]
    cfg = tmp_path / "run.yaml"
    cfg.write_text("agent: reference\n")  # a scalar means a list of one
    assert parse(["--config", str(cfg)])[0].agent == ["reference"]
    assert parse(["--config", str(cfg), "--agent", "tiny"])[0].agent == ["tiny"]


def test_config_yaml_gives_defaults_that_flags_override(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("output-dir: from-yaml\nmax_new_tokens: 7\ntemperature: 0.5\nlora: true\n")
    run, flags = parse(["--config", str(cfg), "--max-new-tokens", "9"])
    assert (run.output_dir, run.max_new_tokens, run.temperature, flags.lora) == ("from-yaml", 9, 0.5, True)
    assert parse(["--max_new_tokens", "2", "--config", str(cfg)])[0].max_new_tokens == 2  # order does not matter


def test_bad_config_files_name_the_file_and_key(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("output_dir: x\nnum_epochs: 3\n")
    with pytest.raises(ConfigError, match=r"run.yaml: unknown setting 'num_epochs'"):
        parse(["--config", str(cfg)])
    cfg.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse(["--config", str(cfg)])
    with pytest.raises(ConfigError, match="does not exist"):
        parse(["--config", str(tmp_path / "missing.yaml")])


def test_field_checks_and_unknown_flags():
    with pytest.raises(ValueError, match="FlagConfig.lora needs progress"):
        parse(["--lora", "--no-progress"])
    with pytest.raises(SystemExit) as exc:
        parse(["--no-such-flag", "1"])
    assert exc.value.code == 2


def test_help_lists_both_dataclasses(capsys):
    with pytest.raises(SystemExit) as exc:
        parse(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "--output_dir" in out and "--lora" in out and "--config" in out


def test_evaluate_keeps_its_flag_names():
    from colbench.evaluate import parse_config

    c = parse_config(["--output", "o", "--agent", "reference", "--agent", "b=tiny", "--baseline-agent", "reference",
                      "--single-turn", "--max_turns", "3", "--no-progress"])
    assert (c.output, c.agent, c.baseline_agent, c.single_turn, c.max_turns, c.progress) == (
        "o", ["reference", "b=tiny"], "reference", True, 3, False)
    assert parse_config(["--output", "o", "--agent", "x", "--baseline_agent", "y"]).baseline_agent == "y"


# ---- a renamed field keeps its earlier name as an alias -----------------------------------


@dataclass
class SampleConfig:
    candidates_per_state: int = field(default=16, metadata={"help": "K per state", "aliases": ["--num_candidates"]})


@pytest.mark.parametrize("argv", [["--candidates_per_state", "4"], ["--candidates-per-state", "4"],
                                  ["--num_candidates", "4"], ["--num_candidates", "2", "--num_candidates", "4"]])
def test_an_alias_sets_the_same_field(argv):
    (cfg,) = parse_configs([SampleConfig], argv)
    assert cfg.candidates_per_state == 4
    assert parse_configs([SampleConfig], [])[0].candidates_per_state == 16


def test_name_and_alias_in_one_command_is_one_line_naming_both(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_configs([SampleConfig], ["--num_candidates", "4", "--candidates-per-state", "4"], prog="prog")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert "--num_candidates and --candidates_per_state name the same setting (candidates_per_state)" in err


def test_alias_in_a_config_file_and_in_make_configs(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("num_candidates: 3\n")
    assert parse_configs([SampleConfig], ["--config", str(cfg)])[0].candidates_per_state == 3
    assert parse_configs([SampleConfig], ["--config", str(cfg), "--candidates_per_state", "5"])[0] \
        .candidates_per_state == 5  # flags override the file, under either name
    cfg.write_text("num_candidates: 3\ncandidates_per_state: 4\n")
    with pytest.raises(ConfigError, match="run.yaml: 'num_candidates' and 'candidates_per_state' name the same"):
        parse_configs([SampleConfig], ["--config", str(cfg)])
    assert make_configs([SampleConfig], {"num_candidates": 5})[0].candidates_per_state == 5
    with pytest.raises(ConfigError, match="make_configs: 'candidates_per_state' and 'num_candidates'"):
        make_configs([SampleConfig], {"candidates_per_state": 5, "num_candidates": 5})


def test_help_names_the_alias(capsys):
    with pytest.raises(SystemExit):
        parse_configs([SampleConfig], ["--help"])
    assert "K per state (alias: --num_candidates)" in " ".join(capsys.readouterr().out.split())


# ---- values type-checked at parse time, one-line errors (run_main) ---------------------------


@pytest.mark.parametrize("yaml_text, message", [
    ("max_new_tokens: 2.5\n", r"run.yaml: max_new_tokens: expected an integer, got 2.5 \(float\)"),
    ("max_new_tokens: true\n", r"run.yaml: max_new_tokens: expected an integer, got True \(bool\)"),
    ("max_new_tokens: many\n", r"run.yaml: max_new_tokens: expected an integer, got 'many' \(str\)"),
    ("max_new_tokens: null\n", r"run.yaml: max_new_tokens: no value \(null\) given; expected an integer"),
    ("temperature: hot\n", r"run.yaml: temperature: expected a number or null, got 'hot' \(str\)"),
    ("agent: [a, [b]]\n", r"run.yaml: agent\[1\]: expected a string, got \['b'\] \(list\)"),
    ("lora: maybe\n", r"run.yaml: lora: expected true or false, got 'maybe' \(str\)"),
])
def test_yaml_values_of_the_wrong_type_fail_at_parse_naming_file_and_field(tmp_path, yaml_text, message):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        parse(["--config", str(cfg)])


def test_yaml_values_are_converted_as_flags_would_be(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("max_new_tokens: '7'\ntemperature: 1e-5\noutput_dir: 2024\nlora: 'yes'\n")  # YAML: 1e-5 is a string
    run, flags = parse(["--config", str(cfg)])
    assert (run.max_new_tokens, run.temperature, run.output_dir, flags.lora) == (7, 1e-5, "2024", True)


def test_field_checks_are_user_errors():
    from colbench.cli import FieldError, UserError

    with pytest.raises(FieldError, match="FlagConfig.lora needs progress") as info:
        parse(["--lora", "--no-progress"])
    assert isinstance(info.value, UserError)


@dataclass
class SpecConfig:
    engine_spec_fields = ("simulator",)  # a class attribute, not a field
    simulator: str = ""


def test_configs_taking_model_specs_get_the_server_flags_as_engine_defaults(capsys):
    from engines.base import EngineOptions, ServerOptions, server_defaults, set_server_defaults

    with pytest.raises(SystemExit):
        parse_configs([SpecConfig], ["--help"])
    out = capsys.readouterr().out
    assert "--request_timeout" in out and "(default: 120.0)" in out and "--max_retries" in out
    with pytest.raises(SystemExit):
        parse(["--help"])
    assert "--request_timeout" not in capsys.readouterr().out  # no model spec, no server flags
    try:
        (cfg,) = parse_configs([SpecConfig], ["--simulator", "openai:m@http://h/v1", "--request-timeout", "9",
                                              "--max_retries", "0"])
        assert cfg.simulator == "openai:m@http://h/v1"
        assert (EngineOptions().request_timeout, EngineOptions().max_retries) == (9.0, 0)
        with pytest.raises(ValueError, match="--request_timeout: must be a finite number > 0, got 0.0"):
            parse_configs([SpecConfig], ["--request_timeout", "0"])
    finally:
        set_server_defaults(ServerOptions())
    assert server_defaults() == ServerOptions()


def test_run_main_maps_errors_to_one_line_and_exit_codes(capsys, monkeypatch):
    from colbench.cli import Interrupted, UserError, run_main

    def failing(exc):
        def main(argv):
            raise exc
        return main

    assert run_main(failing(UserError("--x: bad\nvalue")), [], prog="p") == 2
    assert capsys.readouterr().err == "p: error: --x: bad value\n"
    assert run_main(failing(Interrupted("3 episodes kept in o; rerun to resume")), [], prog="p") == 130
    assert capsys.readouterr().err == "p: interrupted: 3 episodes kept in o; rerun to resume\n"
    assert run_main(failing(KeyboardInterrupt()), [], prog="p") == 130
    assert "interrupted before any output was written" in capsys.readouterr().err
    assert run_main(failing(UserError("bad")), ["--debug"], prog="p") == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.endswith("p: error: bad\n")
    monkeypatch.setenv("SWEET_DEBUG", "1")
    assert run_main(failing(UserError("bad")), [], prog="p") == 2 and "Traceback" in capsys.readouterr().err
    with pytest.raises(ZeroDivisionError):  # a bug is not a user error: it raises as usual
        run_main(lambda argv: 1 / 0, [], prog="p")
    assert run_main(lambda argv: argv, ["a", "--debug"], prog="p") == 0
