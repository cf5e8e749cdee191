"""transformers backend: batched chat generation on CPU or GPU with left padding.

    engine = load_engine("tiny")                       # or "hf:meta-llama/Llama-3.1-8B-Instruct"
    engine = HFEngine.from_model(model, tokenizer)     # sample from the live model a trainer updates

Samples carry the generated ids and their log-probs under the model's unmodified
distribution (log-softmax of the raw logits, temperature 1, no top-p). They are
recorded during generation by a logits processor that runs before temperature and
top-p, so no extra forward pass and no [steps, batch, vocab] logits buffer is needed.

Each row (prompt, copy) draws from its own generator, seeded from the call's seed and the
row (`row_generators`), so its samples do not depend on the batch it shares; on the CPU,
`EngineOptions.workers` deals a call's batches to forked processes.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import replace
from typing import Any, Sequence

from engines.base import (CPU_MAX_BATCH_TOKENS, BatchError, ContextOverflow, Conversation, EngineError, EngineOptions,
                          Sample, SamplingParams, SpecError, fit_prompt, resolve_dtype)
from engines.memory import release_memory
from engines.specs import local_model_path
from engines.templating import cut_completion, end_token_ids, prompt_ids

DTYPES = ("auto", "float32", "bfloat16", "float16")
# transformers writes int(1e30) as a tokenizer's model_max_length when it knows none; no real
# context comes near this
NO_LIMIT = 10**12

Row = tuple[int, int]  # (prompt index, copy index)


def context_length_of(model: Any, tokenizer: Any) -> int | None:
    """The model's context in tokens: its (text) config's `max_position_embeddings`, or the
    tokenizer's `model_max_length` where that is smaller and not the "no limit" sentinel;
    None when neither is known."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limits = [getattr(text, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    limits = [int(v) for v in limits if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < NO_LIMIT]
    return min(limits) if limits else None


def kv_cache(output: Any) -> Any:
    """The KV cache a forward with use_cache=True returned (`cache` from transformers 5.2x on,
    `past_key_values` before)."""
    return output["cache"] if "cache" in output.keys() else output.past_key_values


def kv_cache_argument(model: Any) -> str:
    """The name under which `model`'s forward (a PEFT model's base model's) takes a KV cache."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def plan_batches(rows: Sequence[Row], lengths: Sequence[int], budgets: dict[int, int], batch_size: int,
                 max_tokens: int | None) -> list[tuple[list[Row], int]]:
    """Forward batches of `rows` (in their order), each with its generation budget: at most
    `batch_size` rows, rows × (longest prompt + budget) <= `max_tokens` (None: no bound; a row
    alone always goes), and one budget per batch (`budgets[prompt]`, capped by the context for
    prompts near it: those go with rows of the same cap).

    Why a token bound: on the CPU, memory grows with the tokens in flight, not the rows.
    Measured with SmolLM2-135M (float32, sdpa attention, the CPU default; 2 cores, torch 2.14):
    the model loaded is 0.85 GB resident; a batch of one 4,000-token row peaks at 1.95 GB, one
    8,000-token row at 2.53 GB, two at 3.08 GB (about 0.55 GB per 8k row: KV cache 0.37 GB
    plus the padding mask and activations). Through this engine, four 7,634-token prompts
    with 16 new tokens peak at 4.05 GB in one batch and at 2.85 GB under the default
    CPU_MAX_BATCH_TOKENS = 16384 (two batches of two); batch_size 16 of 8k rows would need
    ~10 GB. Eager attention would hold the scores (one 8k row: 6.9 GB)."""
    chunks: list[tuple[list[Row], int]] = []
    width = 0  # the longest prompt of the last chunk
    for row in rows:
        n, budget = lengths[row[0]], budgets[row[0]]
        if chunks:
            last, last_budget = chunks[-1]
            wider = max(width, n)
            if (last_budget == budget and len(last) < batch_size
                    and (max_tokens is None or (len(last) + 1) * (wider + budget) <= max_tokens)):
                last.append(row)
                width = wider
                continue
        chunks.append(([row], budget))
        width = n
    return chunks


def row_generators(seed: int, rows: Sequence[tuple[int, int]]) -> list[Any]:
    """One private CPU generator per row (prompt index, copy index), seeded from (`seed`,
    row) alone: a row's draws do not depend on the other rows, the batch it shares or the
    process that decodes it."""
    import torch

    def row_seed(c: int, k: int) -> int:
        digest = hashlib.blake2b(f"{seed}/{c}/{k}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1  # torch seeds are < 2**63

    return [torch.Generator().manual_seed(row_seed(c, k)) for c, k in rows]


class _Sampler:
    """Last logits processor: draws each row's next token from softmax(scores) by inverse
    transform, one uniform (float64) per row and step from that row's generator, and
    returns scores that are −inf everywhere else, so greedy decoding picks it. A token of
    probability zero (cut by top-p) is never drawn. (torch.multinomial draws a vocabulary's
    worth of exponentials per row and step from one shared generator.)"""

    def __init__(self, generators: Sequence[Any]) -> None:
        self.generators = list(generators)

    def __call__(self, input_ids, scores):
        import torch

        cdf = torch.softmax(scores.double(), dim=-1).cumsum(-1)
        total = cdf[:, -1:]
        u = torch.cat([torch.rand(1, dtype=torch.float64, generator=g) for g in self.generators])
        tokens = torch.searchsorted(cdf, u.to(cdf.device)[:, None] * total, right=True)
        last = (cdf < total).sum(-1, keepdim=True)  # the last token of non-zero probability
        tokens = torch.minimum(tokens, last)
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens, 0.0)


class _RawLogprobRecorder:
    """Logits processor that records log π(chosen token) from the raw logits.

    Placed first in the processor list, it sees the logits before temperature and
    top-p. Call k sees the k tokens generated so far, so it gathers token k-1 from the
    distribution it stored at call k-1; `finish` gathers the last token.
    """

    def __init__(self) -> None:
        self.prev_logprobs = None  # [B, V] log-softmax of the previous step
        self.steps: list[Any] = []  # each [B]
        self.prompt_len: int | None = None

    def __call__(self, input_ids, scores):
        import torch

        if self.prompt_len is None:
            self.prompt_len = input_ids.shape[1]
        elif self.prev_logprobs is not None:
            self.steps.append(self.prev_logprobs.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev_logprobs = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences):
        """[B, T] log-probs of the generated tokens in `sequences`."""
        import torch

        if self.prev_logprobs is not None and len(self.steps) < sequences.shape[1] - self.prompt_len:
            self.steps.append(self.prev_logprobs.gather(1, sequences[:, -1:]).squeeze(1))
        self.prev_logprobs = None
        return torch.stack(self.steps, dim=1) if self.steps else sequences.new_zeros((sequences.shape[0], 0), dtype=torch.float)


class _StopStringCriteria:
    """Marks a row finished once its generated text contains a stop string.

    Only the tail of each row is decoded: a stop string of b UTF-8 bytes lies within
    the last b + 4 tokens (every token is at least one byte; the extra tokens cover a
    character split across tokens at the window's edge).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str], prompt_len: int) -> None:
        self.tokenizer, self.stop, self.prompt_len = tokenizer, [s for s in stop if s], prompt_len
        self.window = max(len(s.encode()) for s in self.stop) + 4

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        gen = input_ids[:, self.prompt_len:]
        tails = gen[:, -self.window:].tolist()
        for row, tail in enumerate(tails):
            text = self.tokenizer.decode(tail)
            done[row] = any(s in text for s in self.stop)
        return done


class HFEngine:
    """Chat generation with `transformers` (`model.generate`), batched with left padding."""

    def __init__(self, model: str, options: EngineOptions | None = None, *, spec: str | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        options = options or EngineOptions()
        if options.dtype not in DTYPES:
            raise SpecError(f"EngineOptions.dtype must be one of {DTYPES}, got {options.dtype!r}")
        local = local_model_path(model)
        source = str(local) if local is not None else model
        device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = getattr(torch, resolve_dtype(options.dtype))  # the trainers' rule, not the checkpoint's dtype
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
            lm = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        except (OSError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SpecError(
                f"cannot load model {model!r}: expected a local transformers folder or a Hugging Face hub id "
                f"available offline ({first})"
            ) from e
        if options.lora_path:
            from peft import PeftModel

            lm = PeftModel.from_pretrained(lm, options.lora_path).merge_and_unload()
        lm.to(device).eval()
        self._setup(lm, tokenizer, options, spec or f"hf:{model}")

    @classmethod
    def from_model(
        cls, model: Any, tokenizer: Any, spec: str = "hf:live", options: EngineOptions | None = None
    ) -> "HFEngine":
        """Wrap an already loaded model (e.g. the policy a trainer is updating); no copy is made.

        Pass the unwrapped model (`accelerator.unwrap_model(model)`; a PeftModel is
        fine). The model's train/eval mode is restored after each `generate` call.
        """
        engine = cls.__new__(cls)
        engine._setup(model, tokenizer, options or EngineOptions(), spec)
        return engine

    def _setup(self, model: Any, tokenizer: Any, options: EngineOptions, spec: str) -> None:
        self.model, self.tokenizer, self.options, self.spec = model, tokenizer, options, spec
        gen_config = getattr(model, "generation_config", None)
        self.end_ids = end_token_ids(tokenizer, gen_config)
        if not self.end_ids:
            raise EngineError(f"{spec}: the tokenizer has no eos token; cannot tell where a turn ends")
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else min(self.end_ids)
        self.context_length = context_length_of(model, tokenizer)

    @property
    def precision(self) -> str:
        """The dtype the weights sample in ("float32", "bfloat16", ...), recorded per episode."""
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

    @property
    def device(self):
        return next(self.model.parameters()).device

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams) -> list[list[Sample]]:
        """Return `params.n` samples for each conversation, in order.

        Prompts × n are sorted by length and processed in chunks of at most
        `options.batch_size` rows and `options.max_batch_tokens` tokens (`plan_batches`; in
        `options.workers` processes on the CPU); greedy decoding (temperature 0) runs each
        prompt once and repeats the result n times. A prompt that does not fit the context
        (`fit_prompt`) fails on its own: `BatchError` holds its `ContextOverflow` beside the
        others' samples; one near the end of the context generates less
        (`Sample.capped_max_new_tokens`).
        """
        return self.generate_from_ids([prompt_ids(self.tokenizer, conv) for conv in conversations], params)

    def generate_from_ids(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Sample]]:
        """`generate` from prompts already tokenized: e.g. a multi-turn sequence continued
        token for token (examples/trl_grpo_colbench.py), never re-templated."""
        import torch

        prompts = [list(p) for p in prompts]
        budgets: dict[int, int] = {}
        failed: dict[int, ContextOverflow] = {}
        for c, p in enumerate(prompts):
            try:
                budgets[c] = fit_prompt(len(p), params.max_new_tokens, self.context_length, self.spec)
            except ContextOverflow as e:
                failed[c] = e
        copies = params.distinct
        rows = [(c, k) for c in range(len(prompts)) if c not in failed for k in range(copies)]
        rows.sort(key=lambda r: len(prompts[r[0]]))  # similar lengths share a batch: less padding
        chunks = plan_batches(rows, [len(p) for p in prompts], budgets, max(1, self.options.batch_size),
                              self._max_batch_tokens())
        # Every row draws from its own generator (`row_generators`), never the process-wide
        # one, so that a sampler on another thread (LOOP's async rollouts) and the trainer's
        # RNG users (dropout, checkpoint recomputation) cannot interleave their draws, and a
        # row's draws are the same in any batch or worker. An unseeded call takes its seed
        # from the process-wide generator.
        seed = 0 if params.temperature == 0 else params.seed if params.seed is not None else \
            int(torch.randint(2**62, (1,)).item())
        was_training = self.model.training
        try:
            self.model.eval()
            workers = min(self.options.workers, len(chunks))
            if workers > 1 and self.device.type == "cpu":
                results = self._decode_in_processes(prompts, chunks, params, seed, workers)
            else:
                results = self._decode(prompts, chunks, params, seed)
        finally:
            self.model.train(was_training)
        out = [failed[c] if c in failed else [results[(c, k % copies)] for k in range(params.n)]
               for c in range(len(prompts))]
        if failed:
            raise BatchError(out)  # the others' samples are kept: only those prompts fail
        return out

    def _max_batch_tokens(self) -> int | None:
        """The token budget of a forward batch (EngineOptions.max_batch_tokens; None: the CPU's default)."""
        if self.options.max_batch_tokens is not None:
            return self.options.max_batch_tokens
        return CPU_MAX_BATCH_TOKENS if self.device.type == "cpu" else None

    def _decode(self, prompts: list[list[int]], chunks: Sequence[tuple[list[Row], int]], params: SamplingParams,
                seed: int) -> dict[Row, Sample]:
        results: dict[Row, Sample] = {}
        for chunk, budget in chunks:
            generators = row_generators(seed, chunk) if params.temperature > 0 else None
            capped = budget < params.max_new_tokens
            batch = self._generate_batch([prompts[c] for c, _ in chunk],
                                         replace(params, max_new_tokens=budget) if capped else params, generators)
            if capped:  # recorded: a "length" finish here was the context's doing
                batch = [replace(s, capped_max_new_tokens=budget) for s in batch]
            results.update(zip(chunk, batch))
        return results

    def _decode_in_processes(self, prompts: list[list[int]], chunks: Sequence[tuple[list[Row], int]],
                             params: SamplingParams, seed: int, workers: int) -> dict[Row, Sample]:
        """`_decode` with the chunks dealt round robin to `workers` forked processes, each
        with its share of torch's threads (`EngineOptions.workers`: on the CPU one decoding
        process keeps about one core busy). The samples are those of one process."""
        import multiprocessing
        import pickle
        import torch

        threads = max(1, torch.get_num_threads() // workers)
        context = multiprocessing.get_context("fork")

        def child(share, conn) -> None:
            torch.set_num_threads(threads)
            try:
                conn.send_bytes(pickle.dumps(("ok", self._decode(prompts, share, params, seed))))
            except BaseException as e:  # the parent raises it, as one process would
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                conn.send_bytes(pickle.dumps(("error", f"{type(e).__name__}: {first}".rstrip(": "))))
            finally:
                conn.close()

        started = []
        for k in range(workers):
            receive, send = context.Pipe(duplex=False)
            proc = context.Process(target=child, args=(chunks[k::workers], send), name=f"hf-decode-{k}")
            proc.start()
            send.close()
            started.append((proc, receive))
        results: dict[Row, Sample] = {}
        errors = []
        for proc, receive in started:
            try:
                status, payload = pickle.loads(receive.recv_bytes())
            except EOFError:
                status, payload = "error", "the process ended without sending its samples"
            proc.join()
            if status == "ok":
                results.update(payload)
            else:
                errors.append(f"{proc.name}: {payload}")
        if errors:
            raise EngineError(f"{self.spec}: decoding in {workers} processes failed: " + "; ".join(errors))
        return results

    def _generate_batch(self, batch_prompts: list[list[int]], params: SamplingParams,
                        generators: Sequence[Any] | None = None) -> list[Sample]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
        from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

        width = max(len(p) for p in batch_prompts)
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in batch_prompts], device=self.device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch_prompts], device=self.device)
        greedy = params.temperature == 0
        # generate() fills every unset (None) field from the checkpoint's generation
        # config, so neutral values are set explicitly: a checkpoint's repetition penalty
        # must not change the requested distribution. Sampling itself is `_Sampler`, the
        # last processor: generate() decodes greedily, so its temperature/top-k/top-p
        # warpers (and a checkpoint's values for them) never apply.
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=0,
            do_sample=False,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=sorted(self.end_ids),
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        recorder = _RawLogprobRecorder()
        processors = [recorder]  # custom processors run after the built-in ones, which are all off
        if not greedy and params.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(params.temperature))
        if not greedy and params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
        if not greedy:
            processors.append(_Sampler(generators))
        criteria = [_StopStringCriteria(self.tokenizer, params.stop, width)] if any(params.stop) else []
        sequences = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            **self._shared_prefill(batch_prompts, input_ids, attention_mask),
            generation_config=config,
            logits_processor=LogitsProcessorList(processors),
            stopping_criteria=StoppingCriteriaList(criteria),
            # one process generates with a whole model: never wait on the others (transformers
            # turns this on whenever ZeRO-3 is configured in the process, e.g. LOOP's sampler copy)
            synced_gpus=False,
        )
        logprobs = recorder.finish(sequences).tolist()
        generated = sequences[:, width:].tolist()
        samples = []
        for prompt, gen, lps in zip(batch_prompts, generated, logprobs):
            ids, text, reason = cut_completion(self.tokenizer, gen, params.stop, self.end_ids)
            samples.append(
                Sample(
                    text=text,
                    token_ids=tuple(ids),
                    logprobs=tuple(lps[: len(ids)]),
                    finish_reason=reason,
                    prompt_token_ids=tuple(prompt),
                )
            )
        return samples

    def _shared_prefill(self, batch_prompts: list[list[int]], input_ids, attention_mask) -> dict:
        """Where rows of a batch share a prompt (n samples of one state), the prompt is
        prefilled once: each distinct prompt but its last token runs in one batch, its KV
        cache is copied to the rows that hold it, and generate() starts from there. {}
        (generate() prefills every row) when the rows' prompts are all distinct."""
        import torch

        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(p), len(distinct)) for p in batch_prompts]
        if len(distinct) == len(rows) or input_ids.shape[1] < 2:
            return {}
        first = [rows.index(k) for k in range(len(distinct))]  # a row holding each distinct prompt
        mask = attention_mask[first, :-1]
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)  # as generate() places left-padded rows
        with torch.no_grad():
            out = self.model(input_ids=input_ids[first, :-1], attention_mask=mask, position_ids=positions,
                             use_cache=True)
        cache = kv_cache(out)
        cache.reorder_cache(torch.tensor(rows, device=input_ids.device))  # index_select: row i gets its prompt's cache
        return {kv_cache_argument(self.model): cache}

    def close(self) -> None:
        """Drop the model reference and give back the memory it held (once no one else holds it)."""
        self.model = None
        release_memory()
