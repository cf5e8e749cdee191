"""The one interface for chat generation.

Agents, simulated humans, stage-2 candidate sampling and LOOP rollouts all call
`Engine.generate`: a batch of conversations in, `n` samples per conversation out.

Every `Sample` carries the exact token ids the model generated and their
log-probabilities. Training code builds its sequences from these ids and never
re-tokenises generated text (re-applying a chat template to a whole history does not
reproduce the generated tokens: the most reported multi-turn RL bug).

Log-prob convention (all backends): `logprobs[i]` is log π(token_ids[i] | prompt,
token_ids[:i]) under the model's *unmodified* distribution, i.e. log-softmax of the
raw logits at temperature 1, no top-p. This is what a trainer's forward pass
computes, so sampler/trainer gaps measure numerics only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

# A chat message as the OpenAI API and HF chat templates know it:
# {"role": "system" | "user" | "assistant", "content": str | list[content parts]}.
Message = dict[str, Any]
Conversation = list[Message]


class EngineError(RuntimeError):
    """A generation request failed for good (after the backend's retries)."""


class ContextOverflow(EngineError):
    """A prompt that leaves no room in the model's context for a generated token.

    `n_prompt` and `context` are the numbers when known (an OpenAI-compatible server may
    state only its context). It fails its own conversation, through `BatchError`; see
    `fit_prompt` for what the episode runner and the simulators make of it."""

    def __init__(self, message: str, *args: Any, n_prompt: int | None = None, context: int | None = None) -> None:
        super().__init__(message, *args)
        self.n_prompt, self.context = n_prompt, context


def fit_prompt(n_prompt: int, max_new_tokens: int, context: int | None, spec: str = "") -> int:
    """The one rule for prompts against a model's context, used by every engine: how many
    tokens a prompt of `n_prompt` tokens may generate in a context of `context` tokens
    (None: unknown, no limit), at most `max_new_tokens`.

    Returns `max_new_tokens`, or less when the prompt leaves less room (the engine then
    records the cap on the Sample: `capped_max_new_tokens`). Raises `ContextOverflow`,
    "{spec}: prompt of N tokens exceeds the context of M", when not even one token fits.

    What callers make of the overflow (colbench.episodes): an agent's first turn that does
    not fit ends its episode as an engine error (stop "engine_error", reward 0, counted in
    the leaderboard's engine-errors column); a later turn ends it by the token limit (stop
    "token_limit", the last agent message is the answer); a simulated human's prompt is a
    simulator failure. A task whose first prompt does not fit is not an unusable row
    (colbench.tasks): whether it fits depends on the agent's model and prompt, not on the
    data, and a model with a longer context can play it, so it stays a played task that
    this agent failed.
    """
    if context is None:
        return max_new_tokens
    room = context - n_prompt
    if room < 1:
        where = f"{spec}: " if spec else ""
        raise ContextOverflow(f"{where}prompt of {n_prompt} tokens exceeds the context of {context}"
                              + (" (no room for a generated token)" if room == 0 else ""),
                              n_prompt=n_prompt, context=context)
    return min(max_new_tokens, room)


class SpecError(ValueError):
    """A model spec string is malformed or names a model that does not exist."""


class BatchError(EngineError):
    """Some items of a batch failed for good, the others did not.

    `results[i]` is what the call returns for item i (an engine's `list[Sample]`, an
    agent's `Sample`) or the `EngineError` that failed it; callers keep the good items
    and fail only the others (one bad reply ends its own episode, never the run)."""

    def __init__(self, results: list[Any]) -> None:
        self.results = list(results)
        errors = [r for r in self.results if isinstance(r, EngineError)]
        first = str(errors[0]) if errors else "no error"
        super().__init__(f"{len(errors)} of {len(self.results)} requests failed; first: {first}")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `seed` makes a batch reproducible on a given backend.

    Greedy (`temperature == 0`) with `n > 1` is allowed and means n copies of the one
    greedy completion: every backend generates it once and repeats it (vLLM and
    OpenAI-style servers refuse n > 1 with greedy sampling, so nothing is sent as such).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop", tuple(self.stop))

    @property
    def distinct(self) -> int:
        """How many different completions to generate per prompt: 1 for greedy, else n."""
        return 1 if self.temperature == 0 else self.n


@dataclass(frozen=True)
class Sample:
    """One generated completion.

    text:             the completion, cut before any stop string.
    token_ids:        the generated ids, [T]; `tokenizer.decode(token_ids) == text`
                      (stop-string tokens and the end-of-turn token are not included).
    logprobs:         [T] per-token log-probs (convention in the module docstring);
                      None when the backend cannot provide them.
    finish_reason:    "stop": the model emitted its end-of-turn token; "stop_string":
                      cut before one of `SamplingParams.stop`; "length": cut at
                      max_new_tokens. Only "stop" means the model chose to end its
                      turn (trainers append end-of-turn exactly then: sweet/core/tokens.py).
    prompt_token_ids: the ids of the templated prompt the model saw, when known.
    capped_max_new_tokens: the generation budget when the engine gave less than
                      `SamplingParams.max_new_tokens` because the prompt left less room in
                      the model's context (`fit_prompt`); None when not capped. A "length"
                      finish with it set was cut by the context.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None
    finish_reason: str = "stop"
    prompt_token_ids: tuple[int, ...] | None = None
    capped_max_new_tokens: int | None = None


@runtime_checkable
class Engine(Protocol):
    """A chat model behind one `generate` call.

    `context_length`: the most tokens (prompt + generation) the model takes, None where
    unknown (an OpenAI-compatible server states it only in a refusal). Engines check every
    prompt against it with `fit_prompt` and fail those that do not fit on their own
    (`BatchError` holding `ContextOverflow`s)."""

    spec: str
    context_length: int | None

    def generate(
        self, conversations: Sequence[Conversation], params: SamplingParams
    ) -> list[list[Sample]]:
        """Return, for each conversation, `params.n` samples (in order)."""
        ...

    def close(self) -> None:
        """Release processes, GPU memory and connections."""
        ...


def generate_at(engine: Engine, conversations: Sequence[Conversation],
                prompt_ids: Sequence[Sequence[int] | None], params: SamplingParams) -> list[list[Sample]]:
    """Samples at recorded states (stage-2 candidates, a critic's baseline actions): from
    the ids each state's turn was prompted with, never re-templated, when the engine takes
    prompts as ids (`generate_from_ids`: hf, vllm) and every state recorded them; else from
    the chats."""
    if hasattr(engine, "generate_from_ids") and all(ids is not None for ids in prompt_ids):
        return engine.generate_from_ids([list(ids) for ids in prompt_ids], params)  # type: ignore[attr-defined]
    return engine.generate(conversations, params)


def resolve_dtype(name: str) -> str:
    """The one `auto` precision rule, for the trainers (sweet.core.models), the HF engine and
    vLLM alike, so that a sampler and its trainer never differ by default: bfloat16 where a
    CUDA device supports it, float32 elsewhere (a checkpoint's own dtype does not decide:
    SmolLM2 ships in bfloat16). Any other name is returned as given."""
    if name != "auto":
        return name
    import torch

    return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"


# hf on the CPU: the default token budget of a forward batch (EngineOptions.max_batch_tokens)
CPU_MAX_BATCH_TOKENS = 16384


@dataclass
class EngineOptions:
    """Backend options that a model spec string does not carry."""

    device: str | None = None  # hf: "cpu", "cuda", ...; None = cuda if available
    dtype: str = "auto"  # hf/vllm: "auto" (resolve_dtype), "float32", "bfloat16", "float16"
    batch_size: int = 16  # hf: conversations × samples per forward batch
    # hf: rows × (longest prompt + max_new_tokens) per forward batch at most (a row alone always
    # goes), so memory is bounded by the context, not by batch_size × the input. None: on the
    # CPU CPU_MAX_BATCH_TOKENS, on a GPU batch_size alone (measurements: engines.hf.plan_batches).
    max_batch_tokens: int | None = None
    workers: int = 1  # hf on the CPU: forked processes that decode a call's batches (the same samples)
    tensor_parallel_size: int = 1  # vllm
    # vllm: the share of the whole GPU this engine may take (weights + KV cache). 0.85 for
    # an engine alone on its GPUs; colocated with a trainer use
    # engines.vllm_engine.COLOCATED_GPU_MEMORY_UTILIZATION (the arithmetic is there).
    gpu_memory_utilization: float = 0.85
    enable_sleep_mode: bool = False  # vllm: free weights + KV cache between rollouts (sleep/wake_up)
    max_model_len: int | None = None  # vllm
    enable_lora: bool = False  # vllm
    max_lora_rank: int | None = None  # vllm: the largest LoRA rank to load (vLLM's default is 16)
    lora_path: str | None = None  # vllm / hf: adapter applied to the base model
    # openai: the CLI's --request_timeout / --max_retries / --max_reply_mb (ServerOptions) when
    # it parsed them, else ServerOptions' defaults
    request_timeout: float = field(default_factory=lambda: _server_defaults.request_timeout)  # connect + whole reply
    max_concurrency: int = 16  # openai: requests in flight
    max_retries: int = field(default_factory=lambda: _server_defaults.max_retries)  # rounds on 429/5xx/no reply
    max_reply_bytes: int = field(default_factory=lambda: int(_server_defaults.max_reply_mb * 2**20))  # openai
    api_key: str | None = None  # openai: defaults to $OPENAI_API_KEY or "EMPTY"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerOptions:
    """How long to wait for an OpenAI-compatible server and how often to retry: the
    `--request_timeout`, `--max_retries` and `--max_reply_mb` flags of every CLI that
    takes an `openai:` spec (colbench.cli adds them; see `set_server_defaults`)."""

    request_timeout: float = field(default=120.0, metadata={
        "help": "openai engines: seconds per request, connect + the whole reply (a trickling server times out too)"})
    max_retries: int = field(default=5, metadata={
        "help": "openai engines: retry rounds on 429, 5xx, timeouts and refused connections "
                "(exponential backoff with jitter; a round tries every replica)"})
    max_reply_mb: float = field(default=32.0, metadata={
        "help": "openai engines: largest reply accepted, in MB (a bigger one fails its own request; "
                "reading stops at the cap)"})

    def __post_init__(self) -> None:
        for name in ("request_timeout", "max_reply_mb"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"--{name}: must be a finite number > 0, got {value!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ValueError(f"--max_retries: must be an integer >= 0, got {self.max_retries!r}")


_server_defaults = ServerOptions()


def set_server_defaults(options: ServerOptions) -> None:
    """Make `options` the defaults of every EngineOptions built from now on in this process
    (what a CLI does once it parsed its flags, so that engines built deep inside a trainer
    or a simulator honour them). An EngineOptions field given explicitly still wins."""
    global _server_defaults
    _server_defaults = options


def server_defaults() -> ServerOptions:
    """The ServerOptions in force (the CLI's flags once parsed, else the defaults)."""
    return _server_defaults
