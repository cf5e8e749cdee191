"""The trainers whose flags take an `openai:` spec (LOOP's --simulator, SWEET's --sampler and
rounds' --simulator) get --request_timeout / --max_retries / --max_reply_mb, and the
engines they build honour them (colbench.cli, engines.base.ServerOptions)."""

from __future__ import annotations

import importlib

import pytest

from engines.base import EngineOptions, ServerOptions, set_server_defaults
from sweet.core.config import parse_configs
from sweet.train_policy import ALGORITHMS

REQUIRED = {"sweet": ["--episodes", "e.jsonl", "--tasks", "t.jsonl"], "loop": []}


@pytest.mark.parametrize("algorithm", ["sweet", "loop"])
def test_spec_taking_trainers_get_the_server_flags(algorithm):
    module = importlib.import_module(ALGORITHMS[algorithm])
    try:
        configs = parse_configs(module.CONFIGS, [*REQUIRED[algorithm], "--request_timeout", "7", "--max_retries", "1",
                                                 "--max_reply_mb", "4"])
        assert len(configs) == len(module.CONFIGS)  # main(*configs) is unchanged
        opts = EngineOptions()
        assert (opts.request_timeout, opts.max_retries, opts.max_reply_bytes) == (7.0, 1, 4 << 20)
    finally:
        set_server_defaults(ServerOptions())


def test_trainers_without_a_spec_flag_do_not():
    module = importlib.import_module(ALGORITHMS["rft"])
    with pytest.raises(SystemExit) as info:
        parse_configs(module.CONFIGS, ["--episodes", "e.jsonl", "--request_timeout", "7"])
    assert info.value.code == 2
