"""Fixtures for the engine tests: the tiny offline Llama and an HF engine on CPU."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_path():
    from engines.tiny import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
def hf_engine(tiny_path):
    """One float32 CPU engine shared by the hf tests (loading costs ~1 s)."""
    import torch

    from engines import EngineOptions
    from engines.hf import HFEngine

    torch.set_num_threads(1)  # 2 shared cores: more threads only contend
    engine = HFEngine(str(tiny_path), EngineOptions(device="cpu", dtype="float32", batch_size=8), spec="tiny")
    yield engine
    engine.close()
