"""OpenAI-compatible backend: vLLM serve, OpenAI, `transformers serve`, ...

    engine = load_engine("openai:meta-llama/Llama-3.1-70B-Instruct@http://localhost:8000/v1")
    engine = load_engine("openai:meta-llama/Llama-3.1-70B-Instruct@http://a:8000/v1,http://b:8000/v1")

One chat-completions request per conversation (n choices each), at most
`options.max_concurrency` in flight. With several servers (replicas of one model) each
request goes to the replica with the fewest requests in flight (ties in turn), skipping
replicas that failed in the last REPLICA_COOLDOWN_S seconds.

Failures on 429, 5xx, connection errors and timeouts are retried: first at once on each
other replica, then, once every replica failed in a round, after an exponential backoff
with jitter (honouring Retry-After); `options.max_retries` counts those rounds. Other 4xx
are not retried. A failure that survives its retries raises `ServerError` (an
`EngineError`) carrying the server's status and message.

Built on httpx rather than the `openai` package: replica fail-over needs to own the retry
loop (the client retries one server before another could answer), and the vLLM fields
read here (token ids, prompt ids) are outside the client's typed responses.

Optional server features are used when offered and dropped when refused:
- `n`: servers that return fewer choices than asked get one request per missing sample
  (with seed + i, so seeded samples differ);
- `logprobs`: per-token log-probs (None when the server returns none);
- vLLM's `return_tokens_as_token_ids` / `return_token_ids`: exact token ids
  (`token_ids=()` when the server returns none);
- `max_tokens`, or `max_completion_tokens` for servers that refuse the former.
vLLM returns the end-of-turn and stop-string tokens among the ids; give the engine the
served model's tokenizer (`options.extra["tokenizer"]`) to cut them as the local
backends do, so that `tokenizer.decode(token_ids) == text`.
Message contents (including image content parts as data URLs) are sent untouched.
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Sequence

from engines.base import Conversation, EngineError, EngineOptions, Sample, SamplingParams
from engines.templating import cut_completion, end_token_ids

RETRY_STATUSES = frozenset({429}) | frozenset(range(500, 600))
MAX_BACKOFF_S = 30.0
REPLICA_COOLDOWN_S = 5.0  # a replica that failed is tried last for this long
VLLM_EXTRAS = ("return_tokens_as_token_ids", "return_token_ids")


class ServerError(EngineError):
    """A request that failed for good: `status` (None for connection errors) and the server's message."""

    def __init__(self, message: str, status: int | None = None, server_message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message


class _Retryable(Exception):
    def __init__(self, status: int | None, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


def _server_message(response: Any) -> str:
    """The error text of an OpenAI-style error body ({"error": {"message": ...}}), else the raw body."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:2000]
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:2000]
        return str(err)[:2000]
    return str(body)[:2000]


def _parse_choice(choice: dict[str, Any]) -> Sample:
    """One chat-completions choice -> Sample (token ids and log-probs when the server gave them)."""
    message = choice.get("message") or {}
    text = message.get("content") or ""
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = tuple(float(t["logprob"]) for t in content) if content else None
    token_ids: tuple[int, ...] = ()
    if choice.get("token_ids"):  # vLLM return_token_ids
        token_ids = tuple(int(t) for t in choice["token_ids"])
    elif content and all(str(t.get("token", "")).startswith("token_id:") for t in content):
        token_ids = tuple(int(str(t["token"]).split(":", 1)[1]) for t in content)
    if logprobs is not None and token_ids and len(token_ids) != len(logprobs):
        token_ids = token_ids[: len(logprobs)] if len(token_ids) > len(logprobs) else ()
    reason = choice.get("finish_reason") or "stop"
    if reason != "length":  # vLLM's server names the stop string that ended a choice in stop_reason
        reason = "stop_string" if isinstance(choice.get("stop_reason"), str) else "stop"
    return Sample(
        text=text,
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=reason,
    )


class OpenAIEngine:
    """Chat completions against any OpenAI-compatible server."""

    def __init__(
        self,
        model: str,
        base_url: str | Sequence[str],
        options: EngineOptions | None = None,
        *,
        spec: str | None = None,
        retry_backoff: float = 0.5,
        tokenizer: Any = None,
        replica_cooldown: float = REPLICA_COOLDOWN_S,
    ) -> None:
        """`tokenizer` (or `options.extra["tokenizer"]`, a path or hub id) is the served
        model's tokenizer; with it, returned token ids are cut like the local backends'
        (no end-of-turn token, nothing from a stop string on) and text = decode(ids)."""
        import httpx

        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise EngineError("OpenAIEngine needs at least one base_url")
        self.base_urls = [u.rstrip("/") for u in urls]
        self.model, self.base_url = model, self.base_urls[0]
        self.options = options or EngineOptions()
        tokenizer = tokenizer if tokenizer is not None else self.options.extra.get("tokenizer")
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        self._end_ids = end_token_ids(tokenizer) if tokenizer is not None else set()
        self.spec = spec or f"openai:{model}@{','.join(urls)}"
        self.retry_backoff, self.replica_cooldown = retry_backoff, replica_cooldown
        api_key = self.options.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self._client = httpx.Client(
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=self.options.request_timeout,
            limits=httpx.Limits(max_connections=max(1, self.options.max_concurrency)),
        )
        self._pool = ThreadPoolExecutor(max_workers=max(1, self.options.max_concurrency), thread_name_prefix="openai")
        # Optional features, switched off for good the first time the server refuses one.
        self._features = {
            "logprobs": True,
            "vllm_extras": not any("api.openai.com" in u for u in self.base_urls),
            "n": True,
            "max_tokens": True,  # newer OpenAI models want max_completion_tokens instead
        }
        self._lock = threading.Lock()
        # Replica choice: requests in flight, when each last failed, and a turn counter for ties.
        self._in_flight = {u: 0 for u in self.base_urls}
        self._failed_at = {u: float("-inf") for u in self.base_urls}
        self._turn = 0

    # ------------------------------------------------------------------ requests

    def _body(self, conversation: Conversation, params: SamplingParams, n: int, seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": conversation,  # sent as is: image parts and data URLs pass through untouched
            "n": n,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        body["max_tokens" if self._features["max_tokens"] else "max_completion_tokens"] = params.max_new_tokens
        if params.stop:
            body["stop"] = list(params.stop)
        if seed is not None:
            body["seed"] = seed
        if self._features["logprobs"]:
            body["logprobs"] = True
        if self._features["vllm_extras"]:
            body.update({key: True for key in VLLM_EXTRAS})
        return body

    def _refused_feature(self, status: int, message: str, body: dict[str, Any]) -> bool:
        """On a 400/422 that names an optional feature `body` used, switch it off; True to resend."""
        if status not in (400, 422):
            return False
        lowered = message.lower()
        refused = None
        if any(k in body and k in lowered for k in VLLM_EXTRAS):
            refused = "vllm_extras"
        elif "logprobs" in body and "logprobs" in lowered:
            refused = "logprobs"
        elif "max_tokens" in body and "max_completion_tokens" in lowered:
            refused = "max_tokens"
        if refused is None:
            return False
        with self._lock:  # concurrent requests may all be refused; each resends once
            self._features[refused] = False
        return True

    def _post_once(self, base_url: str, body: dict[str, Any]) -> dict[str, Any]:
        """One HTTP attempt: the JSON body, `_Retryable`, or ServerError for a final 4xx."""
        import httpx

        url = f"{base_url}/chat/completions"
        try:
            response = self._client.post(url, json=body)
        except httpx.TimeoutException as e:
            raise _Retryable(None, f"timed out after {self.options.request_timeout:g}s ({type(e).__name__})") from e
        except httpx.TransportError as e:
            raise _Retryable(None, f"connection error: {type(e).__name__}: {e}") from e
        if response.status_code == 200:
            try:
                return response.json()
            except ValueError as e:
                raise _Retryable(200, f"invalid JSON in response: {response.text[:200]!r}") from e
        message = _server_message(response)
        if response.status_code in RETRY_STATUSES:
            retry_after = response.headers.get("retry-after")
            try:
                delay = float(retry_after) if retry_after is not None else None
            except ValueError:
                delay = None
            raise _Retryable(response.status_code, message, delay)
        raise ServerError(
            f"{url} returned HTTP {response.status_code} (not retried): {message}", response.status_code, message
        )

    def _pick(self, exclude: set[str]) -> str:
        """The replica for the next attempt: not recently failed, fewest in flight, then in turn."""
        now = time.monotonic()
        with self._lock:
            candidates = [u for u in self.base_urls if u not in exclude]
            self._turn += 1
            order = {u: (i - self._turn) % len(self.base_urls) for i, u in enumerate(self.base_urls)}
            url = min(candidates, key=lambda u: (now - self._failed_at[u] < self.replica_cooldown,
                                                 self._in_flight[u], order[u]))
            self._in_flight[url] += 1
        return url

    def _post(self, conversation: Conversation, params: SamplingParams, n: int, seed: int | None) -> dict[str, Any]:
        """POST with fail-over and retries; raises ServerError once retries are exhausted."""
        attempts, rounds = 0, 0
        while True:
            tried: set[str] = set()
            last: tuple[str, _Retryable] | None = None
            while len(tried) < len(self.base_urls):
                url = self._pick(tried)
                body = self._body(conversation, params, n, seed)
                attempts += 1
                try:
                    return self._post_once(url, body)
                except ServerError as e:
                    if self._refused_feature(e.status or 0, e.server_message, body):
                        continue  # resend without the refused optional feature (not a retry)
                    raise
                except _Retryable as e:
                    tried.add(url)
                    last = (url, e)
                    with self._lock:
                        self._failed_at[url] = time.monotonic()
                finally:
                    with self._lock:
                        self._in_flight[url] -= 1
            url, e = last  # type: ignore[misc]  # every replica failed in this round
            if rounds >= self.options.max_retries:
                where = f"HTTP {e.status}" if e.status is not None else "no response"
                servers = f"all {len(self.base_urls)} servers, last {url}" if len(self.base_urls) > 1 else url
                raise ServerError(f"{servers}/chat/completions failed after {attempts} attempts ({where}): {e.message}",
                                  e.status, e.message) from None
            delay = min(MAX_BACKOFF_S, self.retry_backoff * 2**rounds) * random.uniform(0.5, 1.5)
            if e.retry_after is not None:
                delay = min(MAX_BACKOFF_S, max(delay, e.retry_after))
            time.sleep(delay)
            rounds += 1

    def _complete(self, conversation: Conversation, params: SamplingParams) -> list[Sample]:
        """`params.n` samples for one conversation (one request, or more if the server ignores n)."""
        wanted = params.distinct  # greedy: one completion, repeated (servers refuse n > 1 greedy)
        n_first = wanted if self._features["n"] else 1
        data = self._post(conversation, params, n_first, params.seed)
        prompt_ids = data.get("prompt_token_ids")
        samples = [_parse_choice(c) for c in sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))]
        if len(samples) < wanted and n_first > 1:
            with self._lock:
                self._features["n"] = False  # the server ignores n: one request per sample from now on
        while len(samples) < wanted:
            seed = None if params.seed is None else params.seed + len(samples)
            extra = self._post(conversation, params, 1, seed)
            choices = extra.get("choices") or []
            if not choices:
                raise ServerError(f"{self.base_url}/chat/completions returned no choices: {str(extra)[:300]}")
            samples.append(_parse_choice(choices[0]))
        if prompt_ids:
            samples = [replace(s, prompt_token_ids=tuple(prompt_ids)) for s in samples]
        if self.tokenizer is not None:
            samples = [self._cut(s, params) for s in samples[:wanted]]
        return [samples[k % wanted] for k in range(params.n)]

    def _cut(self, sample: Sample, params: SamplingParams) -> Sample:
        """Cut server token ids (vLLM keeps the eos / stop-string tokens) so decode(ids) == text."""
        if not sample.token_ids:
            return sample
        ids, text, reason = cut_completion(self.tokenizer, sample.token_ids, params.stop, self._end_ids)
        logprobs = sample.logprobs[: len(ids)] if sample.logprobs is not None else None
        reason = reason if reason != "length" else sample.finish_reason  # the server may drop eos ids
        return replace(sample, text=text, token_ids=tuple(ids), logprobs=logprobs, finish_reason=reason)

    # ------------------------------------------------------------------ Engine API

    def generate(self, conversations: Sequence[Conversation], params: SamplingParams) -> list[list[Sample]]:
        """Return `params.n` samples per conversation, requests running concurrently.

        The first request that fails for good cancels the ones not yet started and its
        ServerError is raised.
        """
        futures = [self._pool.submit(self._complete, conv, params) for conv in conversations]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def close(self) -> None:
        """Stop the worker threads and close the HTTP connections."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()
