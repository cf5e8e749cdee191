"""SWEET-RL stage 1: the per-turn advantage critic, its maths and its scoring API.

The critic is a causal LM θ read through its own LM head (paper, Sec. 4): for agent
turn t with observation o_t (the policy's messages), action a_t (the generated
tokens) and training-time information c (the hidden reference, never shown to the
policy),

    A(o_t, a_t, c) = β · mean_{y ∈ a_t} [ log π_θ(y | o_t, c, y_<) − log π_ref(y | o_t, c, y_<) ]

with π_ref the frozen initial model, conditioned on the SAME context (o_t, c). A
trajectory τ scores Σ_t A(o_t, a_t, c), and the critic is trained with a
Bradley-Terry loss on pairs of trajectories of one task,

    L_BT = −log σ( Σ_t A(chosen turn t) − Σ_t A(rejected turn t) ).

Departures from the reference implementation (not from the paper):
- the trajectory score is the SUM over turns of per-turn means (the reference took
  one mean over all tokens of the trajectory);
- scoring at stage 2 subtracts π_ref computed with c in the context, exactly as in
  training (the reference subtracted a log-prob computed without c);
- over-long contexts lose tokens from the middle, never the action nor the head
  that holds the task and c (the reference truncated from the right).

Conventions (recorded in critic_config.json so scoring reproduces training):
- context = `critic_context_ids`: the policy's chat messages with c appended to the first
  message through the critic_context template (sweet/critic/prompts/critic_context.txt or
  --critic_context_prompt; its text is recorded in critic_config.json, so scoring uses what
  training used); that first message chat-templated, then the policy's recorded prompt ids
  from the end of its own first message on (rule "splice", recorded as `context_rule`), so a
  trajectory's turns continue one another and run as one row;
- action = the turn's generated `token_ids` + the end-of-turn id (`eos_token_id`)
  exactly when the model emitted it (finish reason "stop"; old records without a
  finish reason: appended): the one rule of every trainer, `sweet.core.tokens.action_ids`.
  Ending the turn is part of the action the critic judges. Never re-tokenised text.
- β: the paper does not state the critic's β; default 1.0 (with the mean it only
  rescales the BT logits, i.e. acts like a learning-rate/temperature knob).

The paper's ablations (Sec. 6), switches of the same critic, recorded in critic_config.json so
stage 2 ranks with exactly what was trained:
- `length_normalize=False` (`sweet_sum`): the sum over the action's tokens instead of
  the mean (paper: success collapses to 3.6%).
- `training_info=False` (`sweet_no_info`): c is left out of the context, in training
  and in scoring (paper: 31.2%).
- `head="value"` (`sweet_value_head`): a regression head instead of the LM head,
  A(o_t, a_t) = β · mean_{i ∈ a_t} v(x_≤i) with v a scalar head on the decoder's last
  hidden state (`sweet.core.value_head`), no π_ref; same Bradley-Terry loss over Σ_t A
  (paper: 36.2%).
Stage 2 uses `TrainedCritic.load(critic_dir).advantages(state, actions)`.

A vision-language `--model` (Qwen2-VL; `tiny-vl` in tests) makes the frontend critic the
published fork's: c is the target page's screenshot, each turn also sees the screenshot of
the agent's latest draft, a_t is the turn's text in the critic's tokenizer, on either head
(sweet/critic/vision.py; recorded as `vision` in critic_config.json).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from colbench.io import atomic_write
from colbench.tasks import is_usable, load_tasks, usable_tasks
from colbench.types import Episode
from sweet.core.config import ModelConfig
from sweet.core.models import load_model, load_tokenizer
from sweet.core.records import State, episode_states
from sweet.core.tokens import (action_ids, make_batch, template_ids, truncate_context, turn_action_ids,
                               with_training_info)

if TYPE_CHECKING:  # torch stays out of `--help`
    import torch

    from sweet.core.tokens import TokenBatch

DEFAULT_HEADER = "Training-time information"
CRITIC_CONFIG_FILE = "critic_config.json"


# ---- records ---------------------------------------------------------------------


@dataclass(frozen=True)
class CriticTurn:
    """One agent turn as the critic sees it.

    state:      o_t and c (State.prompt, State.training_info).
    action_ids: a_t = the generated ids + eos, [T]; the tokens A is averaged over.
    """

    state: State
    action_ids: tuple[int, ...]

    def fingerprint(self) -> str:
        """Stable hash of everything that determines this turn's log-probs (no tokenizer needed)."""
        blob = json.dumps([list(self.state.prompt), self.state.training_info, list(self.action_ids)], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class CriticRecord:
    """What `critic_config.json` records: everything scoring needs to reproduce training."""

    beta: float
    length_normalize: bool
    header: str  # the training-time-information header used by with_training_info
    reference_model: str  # model spec of π_ref (the initial model)
    eos_token_id: int  # appended to every action
    lora: bool  # True: critic = reference + adapter in `adapter_dir`; π_ref = adapters disabled
    model_dir: str = "final"  # relative to the critic dir: merged/full weights
    adapter_dir: str | None = None  # relative: the LoRA adapter
    dtype: str = "auto"
    max_length: int = 4096
    keep_head: int = 512
    env: str = "backend"
    head: str = "lm"  # "lm": A from log π_θ − log π_ref; "value": A from a regression head (no π_ref)
    training_info: bool = True  # False: c is not in the critic's context (ablation)
    # the critic_context template's text ({training_info}) and its file record (path, sha256);
    # None: a critic from before template files, its context built from `header`
    context_template: str | None = None
    context_prompt: dict | None = None
    # a vision-language critic (sweet/critic/vision.py): {"max_pixels": .., "min_pixels": ..}; None: text
    vision: dict | None = None
    # how (o_t, c) becomes ids (critic_context_ids): "template" for critics saved before the field
    context_rule: str = "template"

    def save(self, critic_dir: str | Path) -> None:
        atomic_write(Path(critic_dir) / CRITIC_CONFIG_FILE, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, critic_dir: str | Path) -> "CriticRecord":
        path = Path(critic_dir) / CRITIC_CONFIG_FILE
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: is {critic_dir} the output_dir of `python -m sweet.train_critic`?")
        data = json.loads(path.read_text())
        try:
            return cls(**data)
        except TypeError as e:
            raise ValueError(f"{path}: malformed critic config ({e})") from None


# ---- building examples -------------------------------------------------------------


HEADS = ("lm", "value")


CONTEXT_RULES = ("splice", "template")  # CriticRecord.context_rule


def critic_context_ids(tokenizer, state: State, header: str = DEFAULT_HEADER, training_info: bool = True,
                       template: str | None = None, rule: str = "splice") -> list[int]:
    """(o_t, c) as ids: the policy's messages with c added to the first message through the
    critic_context `template` (None: the `header` note); without c when `training_info` is
    False (the ablation).

    rule "splice": the first message (the one holding c) as the chat template renders it,
    then the ids the policy was prompted with from the end of its own first message on, so
    the rest of the context is what the policy saw, token for token, and the turns of a
    trajectory sampled token in, token out continue one another (one row in critic_batch).
    Where the state recorded no ids, or the template does not render the first message as
    a prefix of the whole, it is "template": the messages with c chat-templated whole (the
    rule of critics trained before "splice"; CriticRecord.context_rule)."""
    if rule not in CONTEXT_RULES:
        raise ValueError(f"unknown critic context rule {rule!r}: expected one of {CONTEXT_RULES}")
    messages = (with_training_info(state.prompt, state.training_info, header, template) if training_info
                else list(state.prompt))
    if rule == "splice" and state.prompt_token_ids is not None:
        own, with_c = _first_message_ids(tokenizer, list(state.prompt)), _first_message_ids(tokenizer, messages)
        ids = [int(i) for i in state.prompt_token_ids]
        if own is not None and with_c is not None and ids[:len(own)] == own:
            return with_c + ids[len(own):]
    return template_ids(tokenizer, messages)


def _first_message_ids(tokenizer, messages: list) -> list[int] | None:
    """Ids of the chat template's rendering of messages[0], None when that rendering is not
    the start of the whole chat's."""
    from engines.templating import normalize_messages, render_prompt

    text = tokenizer.apply_chat_template(normalize_messages(messages[:1]), tokenize=False, add_generation_prompt=False)
    if not render_prompt(tokenizer, messages).startswith(text):
        return None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def episode_turn_examples(episode: Episode, training_info: str, tokenizer, tokenize_missing: bool = False,
                          view=None) -> list[CriticTurn]:
    """One CriticTurn per agent turn; the action ids by the one rule of every trainer
    (`sweet.core.tokens.turn_action_ids`: generated ids, + end-of-turn exactly when the model
    emitted it). Turns without `token_ids` (published offline data, scripted agents) are
    an error unless `tokenize_missing`: their text is then tokenised once. A vision-language
    critic (`view`, sweet.critic.vision.ScreenshotView) reads the turn's text in its own tokenizer."""

    examples = []
    for state, turn in zip(episode_states(episode, training_info), episode.agent_turns):
        try:
            ids = (view.action_ids(turn.content, turn.finish_reason) if view is not None
                   else turn_action_ids(tokenizer, turn, tokenize_missing))
            examples.append(CriticTurn(state, ids))
        except ValueError as e:
            raise ValueError(f"episode {episode.episode_id}: agent turn {state.turn_index}: {e}") from None
    return examples


def first_message_length(tokenizer, state: State, context: Sequence[int], header: str = DEFAULT_HEADER,
                         training_info: bool = True, template: str | None = None) -> int:
    """Tokens of `context` (the state's critic context) up to the end of its first message,
    the one that holds c; 0 when the chat template does not render that message as a prefix
    of the whole context."""
    from engines.templating import normalize_messages

    messages = (with_training_info(state.prompt, state.training_info, header, template) if training_info
                else list(state.prompt))
    text = tokenizer.apply_chat_template(normalize_messages(messages[:1]), tokenize=False, add_generation_prompt=False)
    first = tokenizer(text, add_special_tokens=False)["input_ids"]
    return len(first) if list(context[:len(first)]) == list(first) else 0


def critic_batch(tokenizer, examples: Sequence[CriticTurn], header: str, max_length: int | None,
                 keep_head: int, training_info: bool = True, template: str | None = None, view=None,
                 rule: str = "splice") -> "TokenBatch":
    """Turn examples as one packed batch (`make_batch(packed=True)`: the turns of a trajectory
    whose critic contexts continue one another share one row, and one forward pass scores
    them all); with a vision-language critic's `view` (sweet.critic.vision.ScreenshotView), a
    VisionBatch of one row per turn. A context too long for `max_length`
    loses tokens from its middle, keeping the first `keep_head` tokens or, when longer, the
    whole first message (the task and c: a real reference runs to ~1,000 tokens with the
    system prompt, beyond the default head of 512), as far as `max_length` allows."""

    if view is not None:
        return view.batch(examples, header, max_length, keep_head, training_info, template)
    pairs = []
    for ex in examples:
        context = critic_context_ids(tokenizer, ex.state, header, training_info, template, rule)
        room = max_length - len(ex.action_ids) if max_length is not None else len(context)
        if len(context) > room > 0:
            head = max(keep_head, first_message_length(tokenizer, ex.state, context, header, training_info, template))
            context = truncate_context(context, room, head)
        pairs.append((context, ex.action_ids))
    return make_batch(pairs, tokenizer.pad_token_id, max_length=max_length, keep_head=keep_head, packed=True)


def action_logprob_sums(model, batch: "TokenBatch") -> "torch.Tensor":
    """Σ_{y ∈ a} log π(y | context, y_<) per example, [N] (float32), from one forward pass of
    the batch's rows (`TokenBatch.example_sums`); a VisionBatch's images go to the model with it."""
    from sweet.core.logprobs import forward_logprobs
    from sweet.critic.vision import model_inputs

    return batch.example_sums(forward_logprobs(model, batch, **model_inputs(batch))[0])


def action_sums(model, batch: "TokenBatch", head: str = "lm") -> "torch.Tensor":
    """What A reduces over a_t, summed per sequence [B]: log π_θ(y | ...) for the LM
    head, v(x_≤i) for the value head (`sweet.core.value_head.ValueHeadModel`)."""
    if head == "value":
        from sweet.core.value_head import action_value_sums
        from sweet.critic.vision import model_inputs

        return action_value_sums(model, batch, **model_inputs(batch))
    return action_logprob_sums(model, batch)


# ---- the maths (pure functions) ------------------------------------------------------


def per_turn_advantage(
    policy_logp_sum: "torch.Tensor",
    ref_logp_sum: "torch.Tensor",
    n_tokens: "torch.Tensor",
    beta: float,
    length_normalize: bool = True,
) -> "torch.Tensor":
    """A(o_t, a_t, c) = β · mean_y [log π_θ − log π_ref] (or Σ_y without length
    normalisation). Inputs are per-turn sums over a_t's tokens, [N]; returns [N]."""
    diff = policy_logp_sum - ref_logp_sum.to(policy_logp_sum)
    if length_normalize:
        diff = diff / n_tokens.to(diff).clamp(min=1)
    return beta * diff


def trajectory_scores(advantages: "torch.Tensor", trajectory_index: "torch.Tensor", n_trajectories: int) -> "torch.Tensor":
    """score(τ) = Σ_{t ∈ τ} A(o_t, a_t, c): sums per-turn advantages [N] by the
    trajectory each turn belongs to, returns [n_trajectories]."""
    import torch

    out = torch.zeros(n_trajectories, dtype=advantages.dtype, device=advantages.device)
    return out.index_add(0, trajectory_index.to(advantages.device), advantages)


def bradley_terry_loss(score_chosen: "torch.Tensor", score_rejected: "torch.Tensor") -> tuple["torch.Tensor", dict[str, float]]:
    """Per-pair L_BT = −log σ(score(chosen) − score(rejected)), [P], and metrics."""
    import torch.nn.functional as F

    margin = score_chosen - score_rejected
    loss = -F.logsigmoid(margin)
    metrics = {"margin": margin.detach().mean().item(), "accuracy": (margin > 0).float().mean().item()}
    return loss, metrics


def pair_accuracy_and_margin(score_chosen: "torch.Tensor", score_rejected: "torch.Tensor") -> tuple[float, float]:
    """Held-out metrics: share of pairs with score(chosen) > score(rejected) (ties
    count as wrong), and the mean margin."""
    margin = (score_chosen - score_rejected).double()
    if margin.numel() == 0:
        return float("nan"), float("nan")
    return (margin > 0).double().mean().item(), margin.mean().item()


# ---- training-time information --------------------------------------------------------


def load_training_info(tasks: str, env: str = "backend", *, strict: bool = False,
                       unusable: set[str] | None = None) -> dict[str, str]:
    """task_id -> c for every usable task of `tasks` (any source `colbench.tasks.load_tasks`
    reads: our Task records, published rows, `builtin:<split>`), read and validated as
    evaluation reads them (same loader, checks and cache). c is the environment's
    `training_info(task)`, or `task.hidden` when the environment cannot be built.
    Unusable tasks are skipped with one warning line (`usable_tasks`), their ids added to
    `unusable` when given; `strict` stops at the first load naming each instead."""

    info_of = training_info_fn(env)
    loaded = load_tasks(tasks, env=env, on_error="raise" if strict else "keep")
    if unusable is not None:
        unusable.update(t.task_id for t in loaded if not is_usable(t))
    return {t.task_id: info_of(t) for t in usable_tasks(loaded, source=tasks)}


def training_info_fn(env: str):
    """Task -> c: the environment's `training_info`, or `task.hidden` when the
    environment cannot be built here."""
    try:
        from colbench.envs import make_env

        environment = make_env(env)
    except Exception as e:  # the environment may need resources we do not (sandbox, browser)
        warnings.warn(f"cannot build environment {env!r} ({e}); using task.hidden as training-time information")
        return lambda task: task.hidden
    info = {}

    def get(task):
        if task.task_id not in info:
            info[task.task_id] = environment.training_info(task)
        return info[task.task_id]

    return get


# ---- the trained critic, loaded for stage 2 ----------------------------------------------------


class TrainedCritic:
    """A trained critic, ready to score candidate actions exactly as in training.

        critic = TrainedCritic.load("runs/critic")
        advs = critic.advantages(state, [cand.token_ids for cand in candidates])

    Holds the critic θ and π_ref: for LoRA critics one model (π_ref = the base with
    adapters disabled), otherwise two; a value-head critic (`record.head == "value"`) is
    one model and no π_ref. Head, reduction (mean/sum) and whether c is in the context
    all come from the record (CriticRecord), i.e. from training.

    A vision-language critic (`record.vision`) also sees screenshots (`view`, a
    sweet.critic.vision.ScreenshotView): each candidate's page is rendered (once per
    content, `render_dir`), and a candidate's ids are decoded with `action_tokenizer` (the
    policy's; default the critic's) and read as text in the critic's tokenizer.
    """

    def __init__(self, record: CriticRecord, model, ref_model, tokenizer, device, batch_size: int = 16, view=None,
                 action_tokenizer=None):
        self.record = record
        self.model = model
        self.ref_model = ref_model  # None: LoRA, π_ref = model with adapters disabled
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = batch_size
        self.view = view
        self.action_tokenizer = action_tokenizer or tokenizer

    @classmethod
    def load(cls, critic_dir: str | Path, device=None, batch_size: int = 16, action_tokenizer=None,
             render_dir: str | Path | None = None) -> "TrainedCritic":
        """Read critic_config.json in `critic_dir` (a train_critic output_dir) and load
        the trained critic and π_ref, frozen, on `device` (default: cuda if available).
        A vision-language critic renders pages into `render_dir` (default critic_dir/renders)."""
        import torch


        critic_dir = Path(critic_dir)
        record = CriticRecord.load(critic_dir)
        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        ref_cfg = ModelConfig(model=record.reference_model, dtype=record.dtype, max_length=record.max_length,
                              keep_head=record.keep_head)
        if record.head not in HEADS:
            raise ValueError(f"{critic_dir / CRITIC_CONFIG_FILE}: head must be one of {HEADS}, got {record.head!r}")
        if record.head == "value":  # the LM (LoRA: base + adapter) and the head in model_dir; no π_ref
            from sweet.core.value_head import ValueHeadModel

            if record.lora:
                adapter = str(critic_dir / (record.adapter_dir or record.model_dir))
                lm = load_model(ref_cfg, trainable=False, adapter=adapter)
            else:
                lm = load_model(ModelConfig(model=str(critic_dir / record.model_dir), dtype=record.dtype),
                                trainable=False)
            model = ValueHeadModel(lm).load_head(critic_dir / record.model_dir).eval().requires_grad_(False)
            ref_model = None
        elif record.lora:
            if not record.adapter_dir or not (critic_dir / record.adapter_dir).exists():
                raise FileNotFoundError(f"{critic_dir}: LoRA critic without its adapter dir {record.adapter_dir!r}")
            model = load_model(ref_cfg, trainable=False, adapter=str(critic_dir / record.adapter_dir))
            ref_model = None
        else:
            model = load_model(ModelConfig(model=str(critic_dir / record.model_dir), dtype=record.dtype),
                               trainable=False)
            ref_model = load_model(ref_cfg, trainable=False).to(device)
        tokenizer = load_tokenizer(str(critic_dir / record.model_dir))
        view = None
        if record.vision is not None:
            from colbench.scoring.render import RenderCache
            from sweet.critic.vision import ScreenshotView, load_processor

            processor = load_processor(str(critic_dir / record.model_dir))
            tokenizer = processor.tokenizer
            view = ScreenshotView(processor, RenderCache(render_dir or critic_dir / "renders"), **record.vision)
        return cls(record, model.to(device), ref_model, tokenizer, device, batch_size, view, action_tokenizer)

    def advantages(self, state: State, actions: Sequence[Sequence[int]],
                   finish_reasons: Sequence[str | None] | None = None) -> list[float]:
        """A(o_t, a, c) for each candidate action a (generated ids; eos is appended as
        in training: when its finish reason is "stop" or not given) of one state."""
        return self.score_states([(state, actions, finish_reasons or [None] * len(actions))])[0]

    def score_states(self, items: Sequence[tuple]) -> list[list[float]]:
        """advantages() for many states. Each state's context (o_t, c) is run once and
        its KV cache shared by all its candidates (the same log-probs as one padded
        pass of context + action per candidate, at a fraction of the cost); contexts
        that need truncation take the padded path so they are cut exactly as in training.
        items: (state, actions) or (state, actions, finish_reasons)."""

        out = []
        for state, actions, *finish in items:  # finish: optionally, one finish reason per action
            reasons = finish[0] if finish and finish[0] is not None else [None] * len(actions)
            if len(reasons) != len(actions):
                raise ValueError(f"state {state.episode_id}#{state.turn_index}: {len(actions)} actions but "
                                 f"{len(reasons)} finish reasons")
            examples = [CriticTurn(state, self._action_ids(a, r)) for a, r in zip(actions, reasons)]
            if self.view is not None:  # screenshots: one padded pass per chunk
                out.append(self._padded_advantages(examples) if examples else [])
                continue
            context = critic_context_ids(self.tokenizer, state, self.record.header, self.record.training_info,
                                         self.record.context_template, self.record.context_rule)
            longest = max((len(ex.action_ids) for ex in examples), default=0)
            if not examples:
                out.append([])
            elif len(context) + longest <= self.record.max_length and self.record.head == "lm":
                out.append(self._shared_prefix_advantages(context, examples))
            else:
                out.append(self._padded_advantages(examples))
        return out

    def score_trajectories(self, trajectories: Sequence[Sequence[tuple]]) -> list[list[float]]:
        """A(o_t, a_t, c) of every turn of each trajectory, given as its turns' (state, action
        ids, finish reason) in order. The turns are batched as training batches them
        (critic_batch, `batch_size` turns at a time): a trajectory whose contexts continue one
        another is one row of one forward pass, and a context too long is cut as in training."""
        examples = [CriticTurn(state, self._action_ids(a, r)) for turns in trajectories for state, a, r in turns]
        flat = self._padded_advantages(examples) if examples else []
        out, i = [], 0
        for turns in trajectories:
            out.append(flat[i:i + len(turns)])
            i += len(turns)
        return out

    def _action_ids(self, ids: Sequence[int], reason: str | None) -> tuple[int, ...]:
        """a as training read it: the ids + eos, or (vision critic) the ids' text in the critic's tokenizer."""
        if self.view is None:
            return action_ids(ids, self.record.eos_token_id, reason)
        return self.view.action_ids(self.action_tokenizer.decode(list(ids), skip_special_tokens=True), reason)

    def _advantage(self, policy, ref, chunk: Sequence[CriticTurn]) -> list[float]:
        import torch

        n = torch.tensor([len(ex.action_ids) for ex in chunk], device=policy.device)
        return per_turn_advantage(policy, ref, n, self.record.beta, self.record.length_normalize).tolist()

    def _both_models(self, fn):
        """fn(model) for θ and for π_ref (value head: 0, there is no π_ref)."""
        policy = fn(self.model)
        if self.record.head == "value":
            return policy, policy.new_zeros(policy.shape)
        if self.ref_model is None:
            with self.model.disable_adapter():
                return policy, fn(self.model)
        return policy, fn(self.ref_model)

    def _shared_prefix_advantages(self, context: list[int], examples: Sequence[CriticTurn]) -> list[float]:
        import torch

        values: list[float] = []
        with torch.no_grad():
            for start in range(0, len(examples), self.batch_size):
                chunk = examples[start : start + self.batch_size]
                policy, ref = self._both_models(lambda m: shared_prefix_logprob_sums(
                    m, context, [ex.action_ids for ex in chunk], self.tokenizer.pad_token_id, self.device))
                values.extend(self._advantage(policy, ref, chunk))
        return values

    def _padded_advantages(self, examples: Sequence[CriticTurn]) -> list[float]:
        import torch

        values: list[float] = []
        with torch.no_grad():
            for start in range(0, len(examples), self.batch_size):
                chunk = examples[start : start + self.batch_size]
                batch = critic_batch(self.tokenizer, chunk, self.record.header, self.record.max_length,
                                     self.record.keep_head, self.record.training_info, self.record.context_template,
                                     self.view, self.record.context_rule)
                batch = batch.to(self.device)
                policy, ref = self._both_models(lambda m: action_sums(m, batch, self.record.head))
                values.extend(self._advantage(policy, ref, chunk))
        return values


def shared_prefix_logprob_sums(model, context: Sequence[int], actions: Sequence[Sequence[int]], pad_id: int,
                               device) -> "torch.Tensor":
    """Σ_{y ∈ a} log π(y | context, y_<) for several actions after ONE context: the
    context runs once, its KV cache is repeated for the actions. [len(actions)]."""
    import torch

    from engines.hf import kv_cache, kv_cache_argument
    from sweet.core.logprobs import scored_head

    n, width = len(actions), max(len(a) for a in actions)
    ids = torch.full((n, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((n, width), dtype=torch.long, device=device)
    for i, a in enumerate(actions):
        ids[i, : len(a)] = torch.tensor(list(a), device=device)
        mask[i, : len(a)] = 1
    later = mask[:, 1:].bool()
    ctx = torch.tensor([list(context)], device=device)
    # the context's last hidden state predicts each action's first token; action position j predicts j + 1
    with scored_head(model, lambda h: (h[0, -1:].expand(n, -1), ids[:, 0])) as first_logp:
        first = model(input_ids=ctx, use_cache=True)
    cache, cache_kw = kv_cache(first), kv_cache_argument(model)
    cache.batch_repeat_interleave(n)
    attention = torch.cat([torch.ones((n, ctx.shape[1]), dtype=torch.long, device=device), mask], dim=1)
    with scored_head(model, lambda h: (h[:, :-1][later], ids[:, 1:][later])) as rest_logp:
        model(input_ids=ids, attention_mask=attention, use_cache=True, **{cache_kw: cache})
    rest = torch.zeros(later.shape, dtype=rest_logp[0].dtype, device=device).masked_scatter(later, rest_logp[0])
    return first_logp[0] + rest.sum(-1)
