"""The one value head: a causal LM with a scalar regression head v(x_≤i) at every position.

Two uses, one module:
- the SWEET-RL critic's `--head value` ablation (the paper's "regression head instead of
  the LM head", 36.2% success vs 40.4%): `ValueHeadModel(lm)`. The LM head never runs (no
  [B, L, vocab] logits) and is frozen; saved as the LM in HF format (full weights, or a
  LoRA adapter) plus `value_head.safetensors` beside it.
- LOOP's `--advantage ppo` baseline, a policy with a learned value in one module so that
  DDP/FSDP see one forward: `ValueHeadModel(lm, policy=True)` returns (logits, values);
  saved as the LM alone (the final model is a policy); checkpoints (accelerate
  save_state) keep the head.

The head reads the decoder's last hidden state (after its final norm) in its own weights'
dtype: float32 as built (float64 when the whole module is cast, as exactness tests do); it
starts at zero, so an untrained critic scores every action 0 (as the LM-head critic with
θ = π_ref does). The critic's head has no bias (as HF's sequence-classification score
head): under Bradley-Terry a bias only adds b per turn (or b per token without length
normalisation), a prior on the number of turns or tokens alone, and where chosen and
rejected tie its gradient is zero in exact arithmetic, so Adam would step it on
round-off (a different amount under each reduction order). LOOP's value keeps its bias (a
regression target's offset). The module quacks like a HF model where our checkpoint helpers need it
(`save_pretrained`, and `merge_and_unload` for LoRA).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueHeadModel(nn.Module):
    """lm (a causal LM, possibly PEFT-wrapped) + v_head: Linear(hidden, 1), float32, with
    a bias only for `policy`. `policy`: the LM head runs too (forward returns logits and
    values)."""

    def __init__(self, lm, policy: bool = False):
        super().__init__()
        self.lm = lm
        self.policy = policy
        out, inp = lm.get_output_embeddings(), lm.get_input_embeddings()
        if not policy and out is not None and out.weight is not inp.weight:
            # the LM head never runs: frozen, so DDP does not wait for its gradient
            # (tied weights stay trainable: they are the input embeddings too)
            out.requires_grad_(False)
        config = lm.config.get_text_config() if hasattr(lm.config, "get_text_config") else lm.config
        self.vision = getattr(lm.config, "vision_config", None) is not None  # a vision-language LM (Qwen2-VL)
        self.v_head = nn.Linear(config.hidden_size, 1, bias=policy, dtype=torch.float32)
        nn.init.zeros_(self.v_head.weight)
        if policy:
            nn.init.zeros_(self.v_head.bias)
        # FSDP's transformer auto-wrap looks for this on the root module
        self._no_split_modules = getattr(lm, "_no_split_modules", None)

    @property
    def config(self):
        return self.lm.config

    @property
    def peft_config(self):
        # a LoRA policy is saved as adapter + merged copy by the trainer; the critic saves its
        # adapter itself (save_pretrained). AttributeError (hasattr False) otherwise.
        if not self.policy:
            raise AttributeError("peft_config")
        return self.lm.peft_config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **image_inputs):
        """v at every position, [B, L] in the head's dtype (float32 as built); with `policy`,
        (logits [B, L, V], v). `image_inputs`: a vision-language LM's pixel_values,
        image_grid_thw, mm_token_type_ids (sweet.critic.vision.VisionBatch.model_inputs)."""
        if self.policy:
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
            return out.logits, self.v_head(out.hidden_states[-1].to(self.v_head.weight.dtype)).squeeze(-1)
        hidden = self._body()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                              **image_inputs).last_hidden_state
        return self.v_head(hidden.to(self.v_head.weight.dtype)).squeeze(-1)

    def _body(self):
        """The LM without its head: the decoder, or for a vision-language LM the multimodal
        body (vision tower + decoder: `Qwen2VLModel`), which takes the images."""
        if not self.vision:
            return self.lm.get_decoder()
        base = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        return base.model

    # ---- HF-like persistence -----------------------------------------------------------

    def save_pretrained(self, path: str | Path, state_dict: dict | None = None, **kwargs) -> None:
        """The LM (adapter for PEFT) with `save_pretrained`, and the head's weights."""
        from safetensors.torch import save_file

        path = Path(path)
        state_dict = state_dict if state_dict is not None else self.state_dict()
        lm_state = {k[len("lm."):]: v for k, v in state_dict.items() if k.startswith("lm.")}
        if self.policy:  # the final model is the policy alone
            self.lm.save_pretrained(path, state_dict=lm_state, **kwargs)
            return
        if hasattr(self.lm, "peft_config"):  # PEFT extracts the adapter itself
            self.lm.save_pretrained(path, **kwargs)
        else:
            self.lm.save_pretrained(path, state_dict=lm_state, **kwargs)
        head = {k[len("v_head."):]: v.detach().float().cpu().contiguous() for k, v in state_dict.items()
                if k.startswith("v_head.")}
        save_file(head, str(path / VALUE_HEAD_FILE))

    def merge_and_unload(self) -> "ValueHeadModel":
        """LoRA merged into the LM; the same head."""
        merged = ValueHeadModel(self.lm.merge_and_unload(), policy=self.policy)
        merged._load_head_state(self.v_head.state_dict())
        return merged

    def load_head(self, path: str | Path) -> "ValueHeadModel":
        from safetensors.torch import load_file

        file = Path(path) / VALUE_HEAD_FILE
        if not file.exists():
            raise FileNotFoundError(f"{file} not found: {path} holds no value head (was the critic trained with --head value?)")
        self._load_head_state(load_file(str(file)))
        return self

    def _load_head_state(self, state: dict[str, torch.Tensor]) -> None:
        """The head's weights; a critic head saved with a bias (before heads lost it) is
        loaded with one, so such a critic scores as it was trained."""
        if ("bias" in state) != (self.v_head.bias is not None):
            weight = self.v_head.weight
            self.v_head = nn.Linear(weight.shape[1], 1, bias="bias" in state, dtype=weight.dtype, device=weight.device)
        self.v_head.load_state_dict(state)


def action_value_sums(model, batch, **image_inputs) -> torch.Tensor:
    """Σ_{i ∈ a} v(x_≤i) per example, [N] in the head's dtype: v read at every action token
    (`image_inputs`: a vision-language critic's, sweet.critic.vision.model_inputs)."""
    values = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **image_inputs)
    return batch.example_sums(values)
