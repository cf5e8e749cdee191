"""Fixtures of the lab's tests that train or decode with the tiny model (as tests/sweet/conftest.py's)."""

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from sweet.core.models import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def one_torch_thread():
    """The test machine's cores are shared: one thread per process is much faster here."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
