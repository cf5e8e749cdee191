"""Model spec strings: good ones parse, bad ones fail with one clear line."""

from __future__ import annotations

import importlib.util

import pytest

from engines import EngineError, SpecError, check_spec, load_engine, model_path, parse_spec


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
        # bare paths and hub ids are hf models, the same for agents, simulators and trainers
        ("/models/llama", "hf", "/models/llama", None),
        ("meta-llama/Llama-3.1-8B-Instruct", "hf", "meta-llama/Llama-3.1-8B-Instruct", None),
        ("gpt2", "hf", "gpt2", None),
        ("./runs/a:b", "hf", "./runs/a:b", None),  # a ':' inside a path is not a backend
    ],
)
def test_parse_good_specs(spec, backend, model, url):
    parsed = parse_spec(spec)
    assert (parsed.backend, parsed.model, parsed.base_url) == (backend, model, url)


def test_openai_spec_with_several_replicas():
    parsed = parse_spec("openai:meta-llama/Llama-3.1-70B-Instruct@http://a:8000/v1, http://b:8000/v1/")
    assert parsed.model == "meta-llama/Llama-3.1-70B-Instruct"
    assert parsed.base_urls == ("http://a:8000/v1", "http://b:8000/v1") and parsed.base_url == "http://a:8000/v1"


def test_check_spec_builds_nothing_and_checks_local_folders(tmp_path, monkeypatch):
    import engines.tiny

    def no_build():
        raise AssertionError("check_spec must not build the tiny model")

    monkeypatch.setattr(engines.tiny, "tiny_model_path", no_build)
    for spec in ("tiny", "hf:tiny", "vllm:tiny", "hf:org/name", "org/name", "openai:m@http://x/v1"):
        check_spec(spec)
    assert check_spec("vllm:tiny").model == "tiny"
    with pytest.raises(SpecError, match=r"model spec 'runs/sweet/final': path runs/sweet/final does not exist"):
        check_spec("runs/sweet/final")
    assert check_spec(str(tmp_path)) == parse_spec(f"hf:{tmp_path}")


def test_model_path_is_what_trainers_load(tiny_path):
    assert model_path("tiny") == model_path("hf:tiny") == str(tiny_path)
    assert model_path("/ckpt/final") == model_path("hf:/ckpt/final") == "/ckpt/final"
    for spec in ("vllm:org/m", "openai:m@http://x/v1"):
        with pytest.raises(SpecError, match=f"cannot train '{spec}'"):
            model_path(spec)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("", "empty model spec"),
        ("   ", "empty model spec"),
        ("hf:", "bad model spec 'hf:'"),
        ("torch:/x", "unknown backend 'torch'"),
        ("openai:gpt-4o", "openai:<model>@<http(s)://host:port/v1>"),
        ("openai:gpt-4o@localhost:8000", "openai:<model>@<http(s)://host:port/v1>"),
        ("openai:@http://x/v1", "openai:<model>@<http(s)://host:port/v1>"),
        ("openai:m@http://a/v1,b:8000", "openai:<model>@<http(s)://host:port/v1>"),
        ("openai:m@http://a/v1,http://a/v1", "listed twice"),
        ("Vllm:x", "unknown backend 'Vllm'"),
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


def test_the_tiny_tokenizer_corpus_does_not_depend_on_the_interpreter():
    """The tiny model's tokenizer trains on a frozen corpus shipped with the package
    (engines/tiny_corpus), never on the running interpreter's stdlib, whose files change
    between patch releases (3.11.2 and 3.11.7 differ in collections/__init__.py and
    calendar.py): the model is then the same on every machine."""
    import hashlib

    from engines import tiny

    texts = tiny._corpus()
    assert len(texts) == len(tiny.CORPUS_FILES) + 1
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    assert digest == "57d89c06b1f4fb0bd2fff56fab93ee8a8683c0fa5f124ff46cc320626d62c5d3"
