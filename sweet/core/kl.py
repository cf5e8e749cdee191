"""KL(π‖π0) of a policy from its warm start, estimated on the policy's own episodes.

    ratios = episode_log_ratios(policy, reference, tokenizer, episodes, max_length=512, keep_head=64)
    kl = sum(ratios) / len(ratios)

For episodes sampled from π (at temperature 1: the policy itself), the trajectory KL is

    KL(π‖π0) = E_τ~π [log π(τ) − log π0(τ)],   log π(τ) = Σ_agent turns Σ_action tokens log π(token | context),

the human's and the environment's replies cancelling (they do not depend on the policy).
Each episode's log-ratio is one term of that mean, returned per episode so that a caller
can bootstrap it with the success of the same episodes. Turns become (context, action) ids
by the project's one token rule (sweet.core.tokens.episode_segments: the recorded prompt
and generated ids, eos exactly when the model emitted it), scored by the one batched
log-prob pass (sweet.core.logprobs.segment_logps), so the estimate sees what the trainers see.
"""

from __future__ import annotations

from collections.abc import Sequence

from colbench.types import Episode
from sweet.core.tokens import Segment, episode_segments


def episode_log_ratios(policy, reference, tokenizer, episodes: Sequence[Episode], *, max_length: int | None,
                       keep_head: int, chunk_size: int = 32) -> list[float]:
    """log π(τ) − log π0(τ) of each episode (float64 sums over its agent turns' action
    tokens), `policy` and `reference` scored on the same packed segments without gradients."""
    import torch

    from sweet.core.logprobs import segment_logps

    segments: list[Segment] = []
    owner: list[int] = []
    for i, ep in enumerate(episodes):
        for seg in episode_segments(tokenizer, ep):
            segments.append(seg)
            owner.append(i)
    out = torch.zeros(len(episodes), dtype=torch.float64)
    if not segments:
        return out.tolist()
    pad = int(tokenizer.pad_token_id)

    def logps(model) -> torch.Tensor:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                sums, _ = segment_logps(model, segments, pad_id=pad, max_length=max_length, keep_head=keep_head,
                                        chunk_size=chunk_size)
        finally:
            model.train(was_training)
        return sums.double().cpu()

    return out.index_add(0, torch.tensor(owner), logps(policy) - logps(reference)).tolist()


def kl_from_models(policy: str, reference: str, episodes: Sequence[Episode], *, max_length: int = 512,
                   keep_head: int = 64) -> list[float]:
    """`episode_log_ratios` of two saved models (paths or specs, in float32)."""
    from sweet.core.config import ModelConfig
    from sweet.core.models import load_model, load_tokenizer

    def load(spec: str):
        return load_model(ModelConfig(model=spec, dtype="float32"), trainable=False)

    return episode_log_ratios(load(policy), load(reference), load_tokenizer(policy), episodes,
                              max_length=max_length, keep_head=keep_head)
