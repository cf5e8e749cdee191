"""Pairs in the published trainers' file format (OpenRLHF preference JSONL), both ways.

    # the critic's trajectory pairs (stage 1), as scripts/evaluate_{code,html}.py write them
    python -m sweet.critic.export --format openrlhf --kind critic --env frontend \\
        --episodes runs/collect/episodes/base.jsonl --tasks tasks.jsonl --model $POLICY --output critic_pairs.jsonl
    # stage 2's action pairs, as scripts/generate_random_pairs_from_ranks.py --no_prompt writes them
    python -m sweet.critic.export --format openrlhf --kind policy --env frontend \\
        --episodes runs/collect/episodes/base.jsonl --candidates runs/sweet/candidates.jsonl \\
        --model $POLICY --output policy_pairs.jsonl
    # a file the published scripts wrote, read into our episode records (then train on it here:
    # the critic, or multi-turn DPO on one-turn pairs = per-turn DPO)
    python -m sweet.critic.export --format openrlhf --import_pairs ground_truth_preferences.jsonl \\
        --env backend --model $POLICY --output imported.jsonl

What the published files hold (sweet_rl, file:line):
- critic, backend (scripts/evaluate_code.py:86-104): {"chosen": str, "rejected": str}, each the
  last turn's templated prompt and its output concatenated, after "In light that the final
  answer is: {c}." (the --ground_truth_preference_path file; the --preference_path file,
  lines 105-119, has no c: `--training_info false`);
- critic, frontend (scripts/evaluate_html.py:158-192): {"chosen": {"input", "output"},
  "rejected": {...}}, the same text split in two, c prepended to "input";
- policy (scripts/generate_random_pairs_from_ranks.py:77-106): {"chosen": input + output + eos,
  "rejected": ...} with --no_prompt (the published command), else {"prompt": input,
  "chosen": output + eos, "rejected": ...}.
The published trainer (OpenRLHF's train_dpo, YifeiZhou02/collab_openrlhf
openrlhf/datasets/reward_dataset.py:11-47) reads "chosen"/"rejected" (and "prompt" with
--prompt_key). Pairs come from our own rules: the critic's trajectory pairs by the --env's
pairing rule (sweet.core.records.make_trajectory_pairs), the policy's by stage 2's
`make_action_pairs` with the run's --pairs_per_state and --seed (the same pairs it trained on).

A round trip keeps, per pair, the last turn's templated prompt text, its output and c; it
loses the turns before the last one, token ids, log-probs, rewards (an imported pair is two
one-turn episodes of one task scored 1 and 0) and the prompt's message structure (an
imported prompt is the templated text, kept as one user message with its token ids, as
for the published offline trajectories): docs/reference-differences.md.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from colbench.episodes import load_episodes, write_episodes
from colbench.io import atomic_write
from colbench.types import STOP_ANSWERED, Episode, Score, Task, Turn
from sweet.core.config import (check_pairing_rule, fill_env_defaults, pairing_rule_field, parse_configs,
                               strict_tasks_field)
from sweet.core.records import (State, episode_states, make_action_pairs, make_trajectory_pairs, read_candidates,
                                 state_key)
from sweet.core.runs import run_cli

C_PREFIX = "In light that the final answer is: {c}."  # the published critic files' c (evaluate_code.py:92)
FORMATS = ("openrlhf",)
KINDS = ("critic", "policy")
LAYOUTS = ("no_prompt", "prompt")  # policy pairs: generate_random_pairs_from_ranks.py with / without --no_prompt
IMPORTED_AGENT = "openrlhf"


@dataclass
class ExportConfig:
    """What to write (or read back) and where."""

    format: str = field(default="openrlhf", metadata={"help": "openrlhf: OpenRLHF preference JSONL, as the published "
                                                              "sweet_rl scripts write it (module docstring)"})
    kind: str = field(default="critic", metadata={"help": "critic: trajectory pairs (stage 1); policy: stage 2's "
                                                          "action pairs"})
    env: str = field(default="backend", metadata={"help": "environment: its pairing defaults and layout (backend: "
                                                          "strings; frontend: input/output objects)"})
    episodes: str = field(default="", metadata={"help": "episodes JSONL (critic: the pairs' episodes; policy: the "
                                                        "states' episodes)"})
    tasks: str = field(default="", metadata={"help": "critic: the tasks holding c (default: each episode's "
                                                     "meta['task'])"})
    candidates: str = field(default="", metadata={"help": "policy: stage 2's candidates.jsonl"})
    model: str = field(default="tiny", metadata={"help": "the tokenizer whose chat template renders prompts as text "
                                                         "(and whose eos ends policy outputs)"})
    training_info: bool = field(default=True, metadata={"help": "critic: prepend c as the published "
                                                                "--ground_truth_preference_path file does"})
    pairing_rule: str | None = pairing_rule_field()
    success_threshold: float | None = field(default=None, metadata={"help": "critic pairs (default: the --env's)"})
    min_reward_gap: float | None = field(default=None, metadata={"help": "critic pairs (default: the --env's)"})
    pairs_per_state: int = field(default=4, metadata={"help": "policy: stage 2's --pairs_per_state"})
    seed: int = field(default=0, metadata={"help": "policy: stage 2's --seed (the same draws as its run)"})
    layout: str = field(default="no_prompt", metadata={"help": "policy: no_prompt (the published command) | prompt"})
    import_pairs: str = field(default="", metadata={"help": "read this published pairs file into episode records "
                                                            "at --output instead of writing one"})
    output: str = field(default="", metadata={"help": "the JSONL file to write"})
    strict_tasks: bool = strict_tasks_field()

    def __post_init__(self) -> None:
        for name, allowed in (("format", FORMATS), ("kind", KINDS), ("layout", LAYOUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"ExportConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        fill_env_defaults(self, pairing_rule="pairing_rule", success_threshold="success_threshold",
                          min_reward_gap="min_reward_gap")
        check_pairing_rule(self)
        if not self.output:
            raise ValueError("--output is required")
        if not self.import_pairs and not self.episodes:
            raise ValueError("--episodes is required (or --import_pairs FILE to read a published file)")
        if not self.import_pairs and self.kind == "policy" and not self.candidates:
            raise ValueError("--kind policy needs --candidates (stage 2's candidates.jsonl)")


# ---- text of a turn, as the published agent recorded it ----------------------------------------


def prompt_text(tokenizer, messages: Sequence[dict], prompt_token_ids: Sequence[int] | None = None) -> str:
    """The templated prompt as text (the published `input`, vllm_agent.py:66): the recorded ids
    decoded when there are any (what the model saw), else the chat template of the messages."""
    if prompt_token_ids is not None:
        return tokenizer.decode(list(prompt_token_ids), skip_special_tokens=False)
    from engines.templating import render_prompt

    return render_prompt(tokenizer, list(messages))


def generation_header(tokenizer) -> str:
    """The text the chat template puts before an assistant reply (Llama-3: "<|start_header_id|>
    assistant<|end_header_id|>\\n\\n"): where a published string's output starts."""
    from engines.templating import render_prompt

    probe = [{"role": "user", "content": "\x00"}]
    with_prompt = render_prompt(tokenizer, probe)
    without = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    header = with_prompt[len(without):] if with_prompt.startswith(without) else ""
    if not header.strip():
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r}: its chat template adds no "
                         "assistant header to split prompts from outputs")
    return header


def template_head(tokenizer) -> str:
    """The text every templated prompt starts with (Llama-3: "<|begin_of_text|><|start_header_id|>"),
    system message or not: where a published input starts after its c."""
    import os

    from engines.templating import render_prompt

    texts = [render_prompt(tokenizer, [{"role": role, "content": "\x00"}] + ([{"role": "user", "content": "\x00"}]
                                                                            if role == "system" else []))
             for role in ("user", "system")]
    return os.path.commonprefix(texts)


# ---- writing --------------------------------------------------------------------------------------


def critic_rows(cfg: ExportConfig, tokenizer) -> list[dict[str, Any]]:
    """The critic's trajectory pairs as the published critic file: each pair's last agent turn."""
    from sweet.critic.model import load_training_info, training_info_fn

    episodes = load_episodes(cfg.episodes, env=cfg.env, on_error="raise" if cfg.strict_tasks else "skip",
                             usable_only=True)
    pairs = make_trajectory_pairs(episodes, cfg.success_threshold, cfg.min_reward_gap, cfg.pairing_rule)
    info = load_training_info(cfg.tasks, cfg.env, strict=cfg.strict_tasks) if cfg.tasks and cfg.training_info else {}
    info_of = training_info_fn(cfg.env) if cfg.training_info else None

    def side(ep: Episode) -> tuple[str, str]:
        if cfg.training_info and ep.task_id not in info:
            if "task" not in ep.meta:
                raise ValueError(f"episode {ep.episode_id}: no c (give --tasks, or --training_info false)")
            info[ep.task_id] = info_of(Task.from_json(ep.meta["task"]))
        turn = ep.agent_turns[-1]
        head = C_PREFIX.format(c=info[ep.task_id]) if cfg.training_info else ""
        return head + prompt_text(tokenizer, turn.prompt or [], turn.prompt_token_ids), turn.content

    rows = []
    for p in pairs:
        (ci, co), (ri, ro) = side(p.chosen), side(p.rejected)
        if cfg.env == "frontend":  # evaluate_html.py:163-175
            rows.append({"chosen": {"input": ci, "output": co}, "rejected": {"input": ri, "output": ro}})
        else:  # evaluate_code.py:91-103
            rows.append({"chosen": ci + co, "rejected": ri + ro})
    return rows


def policy_rows(cfg: ExportConfig, tokenizer) -> list[dict[str, Any]]:
    """Stage 2's action pairs (`make_action_pairs` over the states that have candidates, in
    episode order, drawn with --seed) as generate_random_pairs_from_ranks.py writes them."""
    episodes = load_episodes(cfg.episodes, env=cfg.env, on_error="raise" if cfg.strict_tasks else "skip",
                             usable_only=True)
    rows = read_candidates(cfg.candidates)
    states: list[State] = [s for ep in episodes for s in episode_states(ep, "") if state_key(s) in rows]
    if not states:
        raise ValueError(f"{cfg.candidates}: no candidates for the states of {cfg.episodes}")
    scored = [(s, rows[state_key(s)].for_state(s)) for s in states]
    pairs, _ = make_action_pairs(scored, cfg.pairs_per_state, random.Random(cfg.seed))
    eos = tokenizer.eos_token or ""
    out = []
    for p in pairs:
        ids = rows[state_key(p.state)].prompt_token_ids
        prompt = prompt_text(tokenizer, p.state.prompt, ids if ids is not None else p.state.prompt_token_ids)
        if cfg.layout == "no_prompt":  # generate_random_pairs_from_ranks.py:87-96
            out.append({"chosen": prompt + p.chosen.text + eos, "rejected": prompt + p.rejected.text + eos})
        else:  # lines 97-106
            out.append({"chosen": p.chosen.text + eos, "rejected": p.rejected.text + eos, "prompt": prompt})
    return out


# ---- reading ---------------------------------------------------------------------------------------


def import_pairs(path: str | Path, env: str, tokenizer) -> list[Episode]:
    """A published pairs file (any layout of the module docstring) as episodes: per line, one
    task (`openrlhf-<line, 6 digits>`, its c in meta["task"] when the prompt carries one) with two
    one-turn episodes, the chosen scored 1 and the rejected 0 (so every pairing rule pairs
    them, and only them). Prompts keep their text as one user message, with its token ids.
    A line that is not a pair names file:line (ValueError)."""
    split = _Splitter(tokenizer)
    episodes = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
                sides = [split.side(row, key) for key in ("chosen", "rejected")]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{where}: not a published pair ({type(e).__name__}: {e})") from None
            c = sides[0][0] if sides[0][0] is not None else sides[1][0]
            task = Task(f"{IMPORTED_AGENT}-{lineno:06d}", env, "", c or "", meta={"where": where})
            for seed, (_, prompt, output) in enumerate(sides):
                turn = Turn("agent", output, prompt=[{"role": "user", "content": prompt}],
                            prompt_token_ids=split.ids(prompt))
                meta = {"where": where, "imported": "openrlhf", **({"task": task.to_json()} if c is not None else {})}
                episodes.append(Episode(task.task_id, env, IMPORTED_AGENT, seed, [turn], answer=output,
                                        score=Score(1.0 - seed, seed == 0), stop_reason=STOP_ANSWERED, meta=meta))
    return episodes


class _Splitter:
    """Tells c, the prompt and the output apart in a published pair's side."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token or ""
        self.header = generation_header(tokenizer)
        self.head = template_head(tokenizer)

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def side(self, row: dict, key: str) -> tuple[str | None, str, str]:
        """(c or None, prompt, output) of row[key]."""
        value = row[key]
        if isinstance(value, dict):  # evaluate_html.py: {"input", "output"}
            prompt, output = str(value["input"]), str(value["output"])
        elif "prompt" in row:  # generate_random_pairs_from_ranks.py without --no_prompt
            prompt, output = str(row["prompt"]), str(value)
        else:  # evaluate_code.py / --no_prompt: one string, the output after the last assistant header
            text = str(value)
            cut = text.rfind(self.header)
            if cut < 0:
                raise ValueError(f"no assistant header {self.header!r} in {key!r} (give the --model it was made with)")
            prompt, output = text[: cut + len(self.header)], text[cut + len(self.header):]
        if self.eos and output.endswith(self.eos):
            output = output[: -len(self.eos)]
        c, prompt = self.strip_c(prompt)
        return c, prompt, output

    def strip_c(self, prompt: str) -> tuple[str | None, str]:
        start = C_PREFIX.split("{c}")[0]
        if not prompt.startswith(start):
            return None, prompt
        end = prompt.find("." + self.head, len(start)) if self.head else -1
        if end < 0:
            raise ValueError(f"cannot tell c from the prompt: no {('.' + self.head)!r} after it")
        return prompt[len(start):end], prompt[end + 1:]


# ---- the CLI --------------------------------------------------------------------------------------


def main(cfg: ExportConfig) -> Path:
    """Write the pairs file (or, with --import_pairs, the episodes file); returns its path."""
    from sweet.core.models import load_tokenizer

    tokenizer = load_tokenizer(cfg.model)
    out = Path(cfg.output)
    if cfg.import_pairs:
        episodes = import_pairs(cfg.import_pairs, cfg.env, tokenizer)
        write_episodes(out, episodes)
        print(f"imported {len(episodes) // 2} pairs from {cfg.import_pairs} as {len(episodes)} episodes: {out}")
        return out
    rows = critic_rows(cfg, tokenizer) if cfg.kind == "critic" else policy_rows(cfg, tokenizer)
    if not rows:
        raise ValueError(f"{cfg.episodes}: no {cfg.kind} pairs to write")
    atomic_write(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"wrote {len(rows)} {cfg.kind} pairs ({cfg.format}) to {out}")
    return out


def cli(argv: list[str] | None = None) -> Path:
    (cfg,) = parse_configs([ExportConfig], argv, description=__doc__.split("\n\n")[0])
    return main(cfg)


if __name__ == "__main__":
    sys.exit(run_cli(cli, prog="python -m sweet.critic.export"))
