"""Model spec strings: good ones parse, bad ones fail with one clear line."""

from __future__ import annotations

import importlib.util

import pytest

from engines import EngineError, SpecError, load_engine, parse_spec


def test_tiny_resolves_to_hf_path(tiny_path):
    assert parse_spec("tiny") == parse_spec("hf:tiny")
    spec = parse_spec("tiny")
    assert spec.backend == "hf" and spec.model == str(tiny_path) and spec.base_url is None


@pytest.mark.parametrize(
    "spec, backend, model, url",
    [
        ("hf:/models/llama", "hf", "/models/llama", None),
        ("hf:meta-llama/Llama-3.1-8B-Instruct", "hf", "meta-llama/Llama-3.1-8B-Instruct", None),
        ("vllm:Qwen/Qwen2-VL-7B", "vllm", "Qwen/Qwen2-VL-7B", None),
        ("openai:gpt-4o@https://api.openai.com/v1", "openai", "gpt-4o", "https://api.openai.com/v1"),
        # the model name may itself contain '@': the URL is after the last one
        ("openai:org/m@v2@http://127.0.0.1:8000/v1", "openai", "org/m@v2", "http://127.0.0.1:8000/v1"),
        ("  hf:/x  ", "hf", "/x", None),
    ],
)
def test_parse_good_specs(spec, backend, model, url):
    parsed = parse_spec(spec)
    assert (parsed.backend, parsed.model, parsed.base_url) == (backend, model, url)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("", "empty model spec"),
        ("   ", "empty model spec"),
        ("llama", "bad model spec 'llama'"),
        ("hf:", "bad model spec 'hf:'"),
        ("torch:/x", "unknown backend 'torch'"),
        ("openai:gpt-4o", "openai:<model>@<http(s)://host:port/v1>"),
        ("openai:gpt-4o@localhost:8000", "openai:<model>@<http(s)://host:port/v1>"),
        ("openai:@http://x/v1", "openai:<model>@<http(s)://host:port/v1>"),
    ],
)
def test_parse_bad_specs(spec, fragment):
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    message = str(info.value)
    assert fragment in message and "\n" not in message


def test_missing_local_model_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(SpecError, match=r"does not exist: expected a folder with config.json") as info:
        load_engine(f"hf:{missing}")
    assert str(missing) in str(info.value) and "\n" not in str(info.value)


def test_local_folder_without_config(tmp_path):
    with pytest.raises(SpecError, match="has no config.json"):
        load_engine(f"hf:{tmp_path}")


def test_bad_dtype_option(tiny_path):
    from engines import EngineOptions

    with pytest.raises(SpecError, match="EngineOptions.dtype must be one of"):
        load_engine("tiny", EngineOptions(dtype="fp8"))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_missing_is_a_clear_engine_error():
    with pytest.raises(EngineError, match=r"vLLM is not installed: pip install '\.\[vllm\]' on a CUDA machine"):
        load_engine("vllm:tiny")


def test_unknown_hub_id_is_a_spec_error_offline(tmp_path):
    """Run offline in a child process (HF_HUB_OFFLINE is read at import): nothing is downloaded."""
    import os
    import subprocess
    import sys

    code = (
        "from engines import load_engine, SpecError\n"
        "try:\n    load_engine('hf:no-such-org-xyz/no-such-model')\n"
        "except SpecError as e:\n    print('SpecError:', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    line = out.stdout.strip()
    assert line.startswith("SpecError: cannot load model 'no-such-org-xyz/no-such-model'"), out.stderr[-2000:]
    assert "hub id available offline" in line and "\n" not in line
