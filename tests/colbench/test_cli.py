"""The one CLI dialect (colbench.cli): both flag spellings, booleans, lists, --config."""

from dataclasses import dataclass, field

import pytest

from colbench.cli import ConfigError, parse_configs


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
