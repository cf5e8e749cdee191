"""OpenAI-compatible backend: vLLM serve, OpenAI, `transformers serve`, ...

    engine = load_engine("openai:meta-llama/Llama-3.1-70B-Instruct@http://localhost:8000/v1")
    engine = load_engine("openai:meta-llama/Llama-3.1-70B-Instruct@http://a:8000/v1,http://b:8000/v1")

One chat-completions request per conversation (n choices each), at most
`options.max_concurrency` in flight. With several servers (replicas of one model) each
request goes to the replica with the fewest requests in flight (ties in turn), skipping
replicas that failed in the last REPLICA_COOLDOWN_S seconds.

Bounded, whatever the server does (the `--request_timeout`, `--max_retries` and
`--max_reply_mb` flags, engines.base.ServerOptions):
- each attempt has one total deadline, `options.request_timeout` seconds for connect,
  send, headers and the whole body (an asyncio deadline on a private event loop, so a
  server trickling one byte every few seconds times out like a silent one);
- a reply is streamed and dropped once it passes `options.max_reply_bytes` (a
  Content-Length above the cap is refused unread), so memory stays bounded;
- 429, 5xx, connection errors and timeouts are retried: first at once on each other
  replica, then, once every replica failed in a round, after an exponential backoff with
  jitter (honouring Retry-After); `options.max_retries` counts those rounds.

Failures are `ServerError`s (`EngineError`s) carrying the server's status and message,
with the API key cut out of every message (servers that echo the Authorization header
cannot leak it into episodes or logs):
- `ServerUnavailable`: retries exhausted; the batch stops (every request would fail alike);
- `ReplyError`: a reply that cannot be used (too large, not JSON, wrong shape such as
  `"message": "oops"`), and other 4xx (not retried): only that conversation fails, the
  others of the batch complete and `generate` raises `BatchError` holding both.
- `ServerContextOverflow` (a `ReplyError` and an `engines.base.ContextOverflow`): a 4xx
  whose message states the model's maximum context length (vLLM serve, OpenAI). The
  engine knows no context of its own (`context_length` None); when the message also
  states the prompt's tokens and the prompt fits, the request is sent once more with the
  generation capped to the room left (`fit_prompt`, `Sample.capped_max_new_tokens`).

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

import asyncio
import json
import os
import random
import re
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Sequence

from engines.base import (BatchError, ContextOverflow, Conversation, EngineError, EngineOptions, Sample, SamplingParams,
                          fit_prompt)
from engines.templating import cut_completion, end_token_ids

RETRY_STATUSES = frozenset({429}) | frozenset(range(500, 600))
MAX_BACKOFF_S = 30.0
REPLICA_COOLDOWN_S = 5.0  # a replica that failed is tried last for this long
VLLM_EXTRAS = ("return_tokens_as_token_ids", "return_token_ids")
ERROR_BODY_BYTES = 64 * 1024  # an error reply is read this far, never further
REDACTED = "[api key redacted]"


class ServerError(EngineError):
    """A request that failed for good: `status` (None for connection errors) and the server's message."""

    def __init__(self, message: str, status: int | None = None, server_message: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message


class ServerUnavailable(ServerError):
    """Retries exhausted (timeouts, refused connections, 429/5xx): the whole batch stops."""


class ReplyError(ServerError):
    """This conversation's request failed (an unusable reply, or a 4xx): only it fails."""


class ServerContextOverflow(ReplyError, ContextOverflow):
    """A 4xx stating the model's context length: the prompt (with its generation) does not
    fit. `context` is the stated length, `n_prompt` the prompt's tokens when stated too."""

    def __init__(self, message: str, status: int, server_message: str, *, n_prompt: int | None,
                 context: int) -> None:
        super().__init__(message, status, server_message)
        self.n_prompt, self.context = n_prompt, context


# How servers state a context overflow (vLLM serve's versions, OpenAI): the context, then the prompt's tokens
_CONTEXT_RE = re.compile(r"maximum (?:context|model) length (?:is|of) (\d+)", re.IGNORECASE)
_PROMPT_RE = re.compile(r"(\d+) in the messages|has (\d+) input tokens|messages resulted in (\d+) tokens"
                        r"|prompt \(length (\d+)\)", re.IGNORECASE)


def context_numbers(message: str) -> tuple[int | None, int] | None:
    """(prompt tokens or None, context) as a server's refusal states them; None when the
    message is not about the context length."""
    context = _CONTEXT_RE.search(message)
    if context is None:
        return None
    prompt = _PROMPT_RE.search(message)
    n_prompt = next((int(g) for g in prompt.groups() if g is not None), None) if prompt else None
    return n_prompt, int(context.group(1))


class _Retryable(Exception):
    def __init__(self, status: int | None, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after


def redact(text: str, secrets: Sequence[str]) -> str:
    """`text` without any of `secrets` (API keys), also when cut short at the end."""
    for secret in secrets:
        if len(secret) < 4:
            continue  # "EMPTY"-style placeholders are long enough; 1-3 chars would redact noise
        text = text.replace(secret, REDACTED)
        for k in range(len(secret) - 1, 3, -1):  # a prefix of the key where the text was cut
            if text.endswith(secret[:k]):
                text = text[:-k] + REDACTED
                break
    return text


def _server_message(data: bytes | bytearray) -> str:
    """The error text of an OpenAI-style error body ({"error": {"message": ...}}), else the raw body."""
    text = data.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)
        return str(err)
    return str(body)


def _preview(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def _parse_choice(choice: Any, index: int = 0) -> Sample:
    """One chat-completions choice -> Sample (token ids and log-probs when the server gave them).
    A choice of the wrong shape raises ValueError naming the field."""
    if not isinstance(choice, dict):
        raise ValueError(f"choice {index} is a {type(choice).__name__}, expected an object")
    message = choice.get("message")
    if message is None:
        message = {}
    if not isinstance(message, dict):
        raise ValueError(f"choice {index}: 'message' is a {type(message).__name__} ({_preview(message, 80)}), "
                         "expected an object with 'content'")
    text = message.get("content")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ValueError(f"choice {index}: 'message.content' is a {type(text).__name__}, expected a string")
    logprobs_field = choice.get("logprobs") or {}
    if not isinstance(logprobs_field, dict):
        raise ValueError(f"choice {index}: 'logprobs' is a {type(logprobs_field).__name__}, expected an object")
    content = logprobs_field.get("content") or []
    if not isinstance(content, list) or not all(isinstance(t, dict) for t in content):
        raise ValueError(f"choice {index}: 'logprobs.content' is not a list of objects")
    try:
        logprobs = tuple(float(t["logprob"]) for t in content) if content else None
        token_ids: tuple[int, ...] = ()
        if choice.get("token_ids"):  # vLLM return_token_ids
            token_ids = tuple(int(t) for t in choice["token_ids"])
        elif content and all(str(t.get("token", "")).startswith("token_id:") for t in content):
            token_ids = tuple(int(str(t["token"]).split(":", 1)[1]) for t in content)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"choice {index}: unreadable token ids or log-probs ({type(e).__name__}: {e})") from None
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


def _parse_reply(data: Any) -> tuple[list[Sample], tuple[int, ...] | None]:
    """A chat-completions reply -> its samples (in index order) and the prompt ids, if any.
    ValueError (the reason) for a reply of the wrong shape."""
    if not isinstance(data, dict):
        raise ValueError(f"the reply is a JSON {type(data).__name__} ({_preview(data, 80)}), "
                         "expected an object with 'choices'")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError(f"the reply has no 'choices' list: {_preview(data)}")
    if not all(isinstance(c, dict) for c in choices):
        raise ValueError("'choices' holds something other than objects")
    ordered = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c.get("index", 0), int) else 0)
    samples = [_parse_choice(c, i) for i, c in enumerate(ordered)]
    prompt_ids = data.get("prompt_token_ids")
    ok_ids = isinstance(prompt_ids, list) and prompt_ids and all(isinstance(t, int) for t in prompt_ids)
    return samples, tuple(prompt_ids) if ok_ids else None


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
        self.context_length: int | None = None  # a server states it only when it refuses a prompt
        self.retry_backoff, self.replica_cooldown = retry_backoff, replica_cooldown
        api_key = self.options.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self._secrets = [api_key] if api_key != "EMPTY" else []
        # Every HTTP attempt runs on one private event loop: asyncio.timeout gives the total
        # deadline (httpx's own timeouts restart on every byte read). The worker threads
        # below keep the retry loop and block on their attempt's future.
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="openai-io", daemon=True)
        self._loop_thread.start()
        self._client = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(self.options.request_timeout),
            limits=httpx.Limits(max_connections=max(1, self.options.max_concurrency)),
        )
        self._attempts: set[Future] = set()  # attempts in flight, cancelled by close()
        self._closed = threading.Event()
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
        if status not in (400, 422) or context_numbers(message) is not None:
            return False  # a context-length refusal names max_tokens too (vLLM): not a feature refused
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

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)

    async def _fetch(self, url: str, body: dict[str, Any]) -> tuple[int, Any, bytes | bytearray, int | None]:
        """One POST within the total deadline: (status, headers, body, size) with the body read
        up to the cap; `size` is set (the bytes seen so far) when the reply passed the cap."""
        async with asyncio.timeout(self.options.request_timeout):
            async with self._client.stream("POST", url, json=body) as response:
                status = response.status_code
                cap = self.options.max_reply_bytes if status == 200 else ERROR_BODY_BYTES
                length = response.headers.get("content-length", "")
                if status == 200 and length.isdigit() and int(length) > cap:
                    return status, response.headers, b"", int(length)  # refused unread
                data = bytearray()  # grown in place: no second copy of a large reply
                async for chunk in response.aiter_bytes():
                    if len(data) + len(chunk) > cap:
                        if status == 200:  # an oversized reply is dropped, not parsed
                            return status, response.headers, b"", len(data) + len(chunk)
                        data += chunk[: cap - len(data)]  # an error body: its beginning is enough
                        break
                    data += chunk
                return status, response.headers, data, None

    def _post_once(self, base_url: str, body: dict[str, Any]) -> dict[str, Any]:
        """One HTTP attempt: the JSON body, `_Retryable`, or ServerError for a final answer."""
        import httpx

        url = f"{base_url}/chat/completions"
        if self._closed.is_set():
            raise EngineError(f"{url}: the engine was closed")
        future = asyncio.run_coroutine_threadsafe(self._fetch(url, body), self._loop)
        with self._lock:
            self._attempts.add(future)
        try:
            status, headers, data, too_big = future.result()
        except (TimeoutError, httpx.TimeoutException) as e:  # the total deadline, or httpx's (never longer)
            raise _Retryable(None, f"no complete reply within {self.options.request_timeout:g}s "
                                   "(--request_timeout)") from e
        except httpx.TransportError as e:
            raise _Retryable(None, self._redact(f"connection error: {type(e).__name__}: {e}")) from e
        except httpx.HTTPError as e:  # an undecodable body, too many redirects, ...: this reply's problem
            raise ReplyError(self._redact(f"{url}: could not read the reply: {type(e).__name__}: {e}")) from e
        except CancelledError:
            raise EngineError(f"{url}: request cancelled (the engine was closed)") from None
        finally:
            with self._lock:
                self._attempts.discard(future)
        if status == 200:
            if too_big is not None:
                cap_mb = self.options.max_reply_bytes / 2**20
                raise ReplyError(f"{url} sent a reply of {too_big / 2**20:.1f} MB or more, over the "
                                 f"{cap_mb:g} MB cap (--max_reply_mb); it was not read further", 200)
            try:
                return json.loads(data)
            except (ValueError, RecursionError):
                text = self._redact(data[:400].decode("utf-8", "replace"))
                raise ReplyError(f"{url} returned invalid JSON: {_preview(text)!r}", 200) from None
        message = self._redact(_server_message(data))[:2000]
        if status in RETRY_STATUSES:
            retry_after = headers.get("retry-after")
            try:
                delay = float(retry_after) if retry_after is not None else None
            except ValueError:
                delay = None
            raise _Retryable(status, message, delay)
        numbers = context_numbers(message) if 400 <= status < 500 else None
        if numbers is not None:
            raise ServerContextOverflow(f"{url} returned HTTP {status} (not retried): {message}", status, message,
                                        n_prompt=numbers[0], context=numbers[1])
        raise ReplyError(f"{url} returned HTTP {status} (not retried): {message}", status, message)

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
                tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
                raise ServerUnavailable(f"{servers}/chat/completions failed after {tries} ({where}): "
                                        f"{e.message}", e.status, e.message) from None
            delay = min(MAX_BACKOFF_S, self.retry_backoff * 2**rounds) * random.uniform(0.5, 1.5)
            if e.retry_after is not None:
                delay = min(MAX_BACKOFF_S, max(delay, e.retry_after))
            if self._closed.wait(delay):
                raise EngineError(f"{url}: the engine was closed while waiting to retry")
            rounds += 1

    def _complete(self, conversation: Conversation, params: SamplingParams) -> list[Sample]:
        """`params.n` samples for one conversation (one request, or more if the server ignores n)."""
        wanted = params.distinct  # greedy: one completion, repeated (servers refuse n > 1 greedy)
        n_first = wanted if self._features["n"] else 1
        data, sent = self._post_fitting(conversation, params, n_first, params.seed)
        samples, prompt_ids = self._parse(data)
        if len(samples) < wanted and n_first > 1:
            with self._lock:
                self._features["n"] = False  # the server ignores n: one request per sample from now on
        while len(samples) < wanted:
            seed = None if params.seed is None else params.seed + len(samples)
            samples.append(self._parse(self._post(conversation, sent, 1, seed))[0][0])
        if prompt_ids:
            samples = [replace(s, prompt_token_ids=tuple(prompt_ids)) for s in samples]
        if sent.max_new_tokens < params.max_new_tokens:
            samples = [replace(s, capped_max_new_tokens=sent.max_new_tokens) for s in samples]
        if self.tokenizer is not None:
            samples = [self._cut(s, params) for s in samples[:wanted]]
        return [samples[k % wanted] for k in range(params.n)]

    def _post_fitting(self, conversation: Conversation, params: SamplingParams, n: int,
                      seed: int | None) -> tuple[dict[str, Any], SamplingParams]:
        """`_post`, and the params it was sent with: a context-length refusal that states a
        prompt which fits (`fit_prompt`) is sent once more with the generation capped to the
        room left; one that does not fit raises `ContextOverflow`."""
        try:
            return self._post(conversation, params, n, seed), params
        except ServerContextOverflow as e:
            if e.n_prompt is None:
                raise
            budget = fit_prompt(e.n_prompt, params.max_new_tokens, e.context, self.spec)
            if budget >= params.max_new_tokens:
                raise  # by the server's own numbers it fits as sent: a resend would be refused alike
            capped = replace(params, max_new_tokens=budget)
            return self._post(conversation, capped, n, seed), capped

    def _parse(self, data: Any) -> tuple[list[Sample], tuple[int, ...] | None]:
        try:
            return _parse_reply(data)
        except ValueError as e:
            raise ReplyError(self._redact(f"{self.base_url}/chat/completions: unusable reply: {e}"), 200) from None

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

        A conversation whose request fails on its own (`ReplyError`: an unusable reply, a
        4xx; `ContextOverflow`: a prompt the server's context cannot hold) does not stop the
        others: once all are done, `BatchError` carries the samples and the errors. A server
        that stays unavailable (`ServerUnavailable`) cancels the requests not yet started and
        is raised.
        """
        futures = [self._pool.submit(self._complete, conv, params) for conv in conversations]
        results: list[Any] = []
        try:
            for f in futures:
                try:
                    results.append(f.result())
                except (ReplyError, ContextOverflow) as e:
                    results.append(e)
        except BaseException:
            for f in futures:
                f.cancel()
            raise
        if any(isinstance(r, EngineError) for r in results):
            raise BatchError(results)
        return results

    def close(self) -> None:
        """Cancel the requests in flight, stop the worker threads, close the connections."""
        self._closed.set()
        with self._lock:
            for future in list(self._attempts):
                future.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()
