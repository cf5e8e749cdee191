"""GRPO on ColBench with TRL's GRPOTrainer, the episodes played against a ColBench
OpenEnv server (`python -m colbench.serve`).

    # CPU: the tiny model on the test bed (what tests/examples/test_trl_grpo_colbench.py runs)
    python -m colbench.serve --env testbed --tasks builtin:train --simulator scripted:testbed --port 8000 &
    python examples/trl_grpo_colbench.py --model tiny --env-url http://127.0.0.1:8000 --max-steps 4 \\
        --output-dir runs/trl_grpo

    # GPUs: TRL's vLLM server generates (GPU 0), the trainer trains (GPU 1), ColBench serves the
    # backend with an LLM simulated human (GPU 2)
    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model meta-llama/Llama-3.1-8B-Instruct --port 8001 &
    CUDA_VISIBLE_DEVICES=2 python -m colbench.serve --env backend --tasks builtin:train \\
        --simulator vllm:meta-llama/Llama-3.1-70B-Instruct --max-connections 256 --port 8000 &
    CUDA_VISIBLE_DEVICES=1 python examples/trl_grpo_colbench.py --model hf:meta-llama/Llama-3.1-8B-Instruct \\
        --env-url http://127.0.0.1:8000 --use-vllm --vllm-server-url http://127.0.0.1:8001 \\
        --num-generations 8 --per-device-train-batch-size 8 --gradient-accumulation-steps 8 \\
        --learning-rate 1e-6 --max-new-tokens 512 --max-completion-length 6144 --bf16

Which of TRL's modes, and why. TRL 1.16 documents two ways to train on environments:
`environment_factory` (the model calls the environment's methods as tools, through its
chat template's tool-calling format) and `rollout_func` (the caller plays the episode
and hands TRL the tokens). ColBench's agent talks in plain chat (a question, or the
answer marker and the answer), and the tiny model's template has no tool calling, which
`environment_factory` refuses; so this script uses `rollout_func`: it plays each
episode through `colbench.client.ColBenchClient`, one agent turn at a time, and returns
one token sequence per episode with `env_mask` 0 on the human's tokens.

What TRL keeps of our token-exact turns, and what differs from our own trainers:
- The agent's tokens are the sampled ids (never re-tokenised), with the end-of-turn id
  exactly when the model emitted it (sweet.core.tokens.action_ids, the one rule).
- An episode is ONE sequence: the first turn's templated prompt, then every agent
  turn and the human's reply between them. Each turn is sampled as a continuation of
  that sequence, so what the model saw and what TRL trains on are the same ids. Our
  runner instead re-templates the whole chat before every turn; the two can differ
  where the tokenizer would merge across a turn boundary differently (the
  templated text is the same). The human's reply is tokenised from the text between
  two renderings of the chat template (it must render the chat as a prefix of the
  next one; a template that does not is an error, named).
- The reward is the episode's final score (tests passed; CLIP cosine), given to every
  agent token of the sequence through GRPO's group advantage: no per-turn critic
  (SWEET-RL's credit assignment is ours only), no LOOP leave-one-out estimator.
- `--max-completion-length` caps the whole dialogue after the first prompt; an
  episode that would pass it stops there with reward 0 (the server drops it after
  its idle timeout), counted in the log as `colbench/truncated`.
- Sampling on CPU goes through our HF engine on the live policy (raw log-probs); with
  `--use-vllm` it goes through TRL's vLLM client, which caps each turn at TRL's
  `max_completion_length` rather than `--max-new-tokens` (untested here: no GPU).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence


@dataclass
class ScriptConfig:
    """The run: the policy, the server, and TRL's GRPO settings that matter here."""

    model: str = field(default="tiny", metadata={"help": "policy to train: 'tiny', 'hf:<path or hub id>'"})
    env_url: str = field(default="http://127.0.0.1:8000", metadata={"help": "a `python -m colbench.serve` server"})
    output_dir: str = field(default="runs/trl_grpo", metadata={"help": "checkpoints, logs, resolved config"})
    max_steps: int = field(default=10, metadata={"help": "optimizer steps"})
    num_generations: int = field(default=4, metadata={"help": "episodes per task (GRPO group)"})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "episodes per device per micro-batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per step"})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate"})
    beta: float = field(default=0.0, metadata={"help": "KL coefficient (0: no reference model)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    max_new_tokens: int = field(default=128, metadata={"help": "agent tokens per turn at most (HF sampling)"})
    max_completion_length: int = field(default=1024, metadata={"help": "tokens of the whole dialogue after the prompt"})
    use_vllm: bool = field(default=False, metadata={"help": "sample with TRL's vLLM server (GPUs)"})
    vllm_server_url: str = field(default="http://127.0.0.1:8001", metadata={"help": "`trl vllm-serve` address"})
    bf16: bool = field(default=False, metadata={"help": "train in bfloat16 (GPUs)"})
    logging_steps: int = field(default=1, metadata={"help": "log every N steps"})
    seed: int = field(default=0, metadata={"help": "random seed"})

    def __post_init__(self) -> None:
        checks = [("max_steps", self.max_steps >= 1), ("num_generations", self.num_generations >= 2),
                  ("per_device_train_batch_size", self.per_device_train_batch_size >= 1),
                  ("gradient_accumulation_steps", self.gradient_accumulation_steps >= 1),
                  ("learning_rate", self.learning_rate > 0), ("temperature", self.temperature > 0),
                  ("max_new_tokens", self.max_new_tokens >= 1),
                  ("max_completion_length", self.max_completion_length >= self.max_new_tokens)]
        for name, ok in checks:
            if not ok:
                raise ValueError(f"--{name.replace('_', '-')}: invalid value {getattr(self, name)!r}")
        from engines.specs import check_spec

        if check_spec(self.model).backend != "hf":
            raise ValueError(f"--model: cannot train {self.model!r}: give 'tiny' or 'hf:<path or hub id>'")


@dataclass
class _Play:
    """One episode being played: its client and the sequence TRL will train on."""

    client: Any
    prompt_ids: list[int]
    messages: list[dict[str, str]]
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)  # 1 = the agent's tokens, 0 = the human's
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    truncated: bool = False


class ColBenchRollout:
    """TRL's `rollout_func`: prompts are task ids; each one is an episode on the server."""

    def __init__(self, cfg: ScriptConfig):
        self.cfg = cfg

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        from colbench.client import ColBenchClient
        from engines.templating import prompt_ids

        tok = trainer.processing_class
        plays: list[_Play] = []
        try:
            for task_id in prompts:
                client = ColBenchClient(self.cfg.env_url)
                plays.append(_Play(client, [], []))
                obs = client.reset(task_id=task_id).observation
                plays[-1].messages, plays[-1].prompt_ids = obs.messages, prompt_ids(tok, obs.messages)
            with ThreadPoolExecutor(max_workers=len(plays)) as pool:
                while active := [p for p in plays if not p.done]:
                    turns = self._sample(trainer, active)
                    # sent at once, so the server batches them: one simulator call per turn of the batch
                    results = list(pool.map(lambda pt: pt[0].client.step(pt[1][2]), zip(active, turns)))
                    for play, (ids, lps, text), result in zip(active, turns, results):
                        self._agent_turn(tok, play, ids, lps, text, result)
        finally:
            for p in plays:
                p.client.close()
        return {"prompt_ids": [p.prompt_ids for p in plays], "completion_ids": [p.completion_ids for p in plays],
                "logprobs": [p.logprobs for p in plays], "env_mask": [p.env_mask for p in plays],
                "env_reward": [p.reward for p in plays], "truncated": [p.truncated for p in plays]}

    def _agent_turn(self, tok, play: _Play, ids: list[int], lps: list[float], text: str, result) -> None:
        """Append the sampled turn and, unless the server ended the episode, the human's reply (masked)."""
        from engines.templating import render_prompt

        play.completion_ids += ids
        play.env_mask += [1] * len(ids)
        play.logprobs += lps
        if result.done:
            play.done, play.reward = True, float(result.reward or 0.0)
            return
        before = render_prompt(tok, play.messages) + text
        after = render_prompt(tok, result.observation.messages)
        if not after.startswith(before):
            raise ValueError(f"the chat template of {tok.name_or_path!r} does not render a chat as a prefix of the "
                             "next one; a single-sequence episode cannot be built for TRL")
        human = tok(after[len(before):], add_special_tokens=False)["input_ids"]
        if ids and ids[-1] == tok.eos_token_id and human[:1] == [tok.eos_token_id]:
            human = human[1:]  # the model's own end-of-turn is already in the sequence
        play.messages = result.observation.messages
        if len(play.completion_ids) + len(human) + 1 > self.cfg.max_completion_length:
            play.done, play.truncated, play.reward = True, True, 0.0  # no room for another turn
            return
        play.completion_ids += human
        play.env_mask += [0] * len(human)
        play.logprobs += [0.0] * len(human)

    def _sample(self, trainer, active: Sequence[_Play]) -> list[tuple[list[int], list[float], str]]:
        """One agent turn per episode, continuing each sequence token for token."""
        tok = trainer.processing_class
        contexts = [p.prompt_ids + p.completion_ids for p in active]
        room = [self.cfg.max_completion_length - len(p.completion_ids) for p in active]
        if trainer.use_vllm:  # TRL's vLLM client: ids in, ids (eos included) and log-probs out
            _, completions, logprobs, _ = trainer.vllm_generation.generate(contexts, None, 1)
            out = []
            for ids, lps, r in zip(completions, logprobs, room):
                ids, lps = list(ids)[:r], [lp[0] for lp in lps][:r]
                out.append((ids, lps, tok.decode(ids, skip_special_tokens=True)))
            return out
        from engines.base import SamplingParams
        from engines.hf import HFEngine
        from sweet.core.tokens import action_ids, eos_id

        engine = HFEngine.from_model(trainer.accelerator.unwrap_model(trainer.model), tok)
        params = SamplingParams(temperature=self.cfg.temperature, max_new_tokens=min(self.cfg.max_new_tokens, *room))
        out = []
        for [s] in engine.generate_from_ids(contexts, params):
            ids = list(action_ids(s.token_ids, eos_id(tok), s.finish_reason))  # + eos exactly when emitted
            lps = list(s.logprobs or [0.0] * len(s.token_ids)) + [0.0] * (len(ids) - len(s.token_ids))
            out.append((ids, lps, s.text))
        return out


def env_reward(completions, env_reward: list[float], truncated: list[bool], log_metric=None, **kwargs) -> list[float]:
    """The server's score of each episode (TRL reward function; the rollout supplies it)."""
    if log_metric is not None:
        log_metric("colbench/truncated", sum(truncated) / len(truncated))
    return [float(r) for r in env_reward]


def main(cfg: ScriptConfig) -> Any:
    """Train; returns the trainer (its state.log_history holds the metrics)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from colbench.client import ColBenchClient
    from engines.specs import model_path

    path = model_path(cfg.model)
    task_ids = ColBenchClient(cfg.env_url).task_ids()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({"script": asdict(cfg), "n_tasks": len(task_ids)}, indent=2) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if cfg.bf16 else torch.float32)
    args = GRPOConfig(
        output_dir=str(out), max_steps=cfg.max_steps, num_generations=cfg.num_generations,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps, learning_rate=cfg.learning_rate,
        beta=cfg.beta, temperature=cfg.temperature, max_completion_length=cfg.max_completion_length,
        use_vllm=cfg.use_vllm, vllm_mode="server", vllm_server_base_url=cfg.vllm_server_url if cfg.use_vllm else None,
        bf16=cfg.bf16, logging_steps=cfg.logging_steps, save_strategy="no", report_to="none", seed=cfg.seed,
        use_cpu=not torch.cuda.is_available())
    trainer = GRPOTrainer(model=model, reward_funcs=env_reward, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": task_ids}), rollout_func=ColBenchRollout(cfg))
    trainer.train()
    trainer.save_model(str(out / "final"))
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=2) + "\n")
    return trainer


def parse(argv: Sequence[str] | None = None) -> ScriptConfig:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout: colbench, engines, sweet
    from colbench.cli import parse_configs

    (cfg,) = parse_configs([ScriptConfig], argv, prog="examples/trl_grpo_colbench.py",
                           description=__doc__.split("\n\n")[0])
    return cfg


if __name__ == "__main__":
    try:
        config = parse()
    except ValueError as e:
        print(f"examples/trl_grpo_colbench.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    main(config)
