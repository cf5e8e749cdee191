"""sweet/core/kl.py: the per-episode log-ratio log π(τ) − log π0(τ) behind the benchmark's KL."""

from __future__ import annotations

import copy

import pytest
import torch

from sweet.core.kl import episode_log_ratios
from sweet.core.tokens import episode_segments


@pytest.fixture
def models(one_torch_thread):
    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model

    model = load_model(ModelConfig(model="tiny", dtype="float32"), trainable=False)
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model, other


def test_a_model_against_itself_is_exactly_zero(models, tiny_tokenizer, make_synthetic):
    _, episodes = make_synthetic(tiny_tokenizer, 3)
    model, _ = models
    assert episode_log_ratios(model, model, tiny_tokenizer, episodes, max_length=256, keep_head=16,
                              chunk_size=4) == [0.0] * len(episodes)


def test_a_perturbed_copy_equals_a_naive_full_logits_sum(models, tiny_tokenizer, make_synthetic):
    """Each episode's Σ over agent turns Σ over action tokens (eos included, as the token rule
    says) of log π − log π0, from full [L, vocab] logits of one unpadded sequence per turn."""
    _, episodes = make_synthetic(tiny_tokenizer, 3)
    model, other = models

    def naive(m, ep) -> float:
        total = 0.0
        for seg in episode_segments(tiny_tokenizer, ep):
            ids = torch.tensor([list(seg.context) + list(seg.action)])
            with torch.no_grad():
                logp = torch.log_softmax(m(input_ids=ids).logits[0].double(), -1)
            start = len(seg.context)
            total += float(sum(logp[i - 1, ids[0, i]] for i in range(start, ids.shape[1])))
        return total

    got = episode_log_ratios(other, model, tiny_tokenizer, episodes, max_length=256, keep_head=16, chunk_size=4)
    want = [naive(other, ep) - naive(model, ep) for ep in episodes]
    assert all(abs(w) > 0.1 for w in want)  # the perturbation moves every episode
    assert got == pytest.approx(want, abs=1e-3, rel=1e-4)
    assert len(episode_segments(tiny_tokenizer, episodes[0])) == 2  # two agent turns per episode, both counted
