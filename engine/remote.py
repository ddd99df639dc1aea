"""RemoteEngine: the Engine interface over any OpenAI-compatible server.

Retrieval and prompt assembly stay local; generation goes to a prefixrag replica, sglang-router in
front of several, vLLM, SGLang or llama.cpp's server. Chat messages go to ``/v1/chat/completions``;
token-id prompts (what ``rag.Pipeline`` sends) to ``/v1/completions``, where the assembler's
stable-first layout reaches the server's own prefix cache:

- ``prompt_format="token_ids"`` sends the ids as they are (prefixrag, vLLM and SGLang take them);
- ``"text"`` decodes them with the local tokenizer and sends the text. sglang-router needs this: it
  refuses token-id prompts (422), and its ``cache_aware`` policy matches prefixes on the text. For
  prefixrag's assembler the text re-tokenizes to the same ids (separators lead each segment);
- ``"auto"`` (default) sends ids and, when a server refuses a token-id prompt with a 4xx naming
  ``prompt``, switches to text for good (one warning) and retries that request.

``cached_tokens`` comes from ``usage.prompt_tokens_details.cached_tokens`` (streamed with
``stream_options.include_usage``) when the server reports it. A namespace travels as ``cache_salt``
(vLLM's and prefixrag's name): prefixrag joins it to the caller's tenant, never across tenants.
Note that sglang-router 0.3 forwards ``cache_salt`` on ``/v1/completions`` but drops it from chat
requests. Each request carries an ``X-Request-Id`` (the result's ``request_id``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from engine.backend import BackendCapabilities
from engine.chunks.reuse import ChunkReuse
from engine.encoding import PromptInput
from engine.request import EngineError, GenerationResult, QueueFullError, StreamEvent, final_result
from engine.sampling import SamplingParams

log = logging.getLogger(__name__)

PromptFormat = Literal["auto", "token_ids", "text"]
_FORMATS = ("auto", "token_ids", "text")


class RemoteEngine:
    """Generate through an OpenAI-compatible HTTP API, with the same calls as :class:`engine.Engine`.

    ``timeout_s`` bounds each wait (for the response to start, then between streamed chunks);
    ``tokenizer`` is a tokenizer, or a name/path to load one from; by default the ``model``'s own is
    loaded on first use (needed for token-level prompts: ``rag.Pipeline``, ``encode``, text prompts).

    Example:
        >>> eng = RemoteEngine("http://127.0.0.1:8000/v1", model="smollm2-135m-instruct")
        >>> r = eng.generate([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=8))
        >>> r.text, r.prompt_tokens, r.cached_tokens                  # doctest: +SKIP
        ('Hello! How can I help', 31, 0)
        >>> pipeline = Pipeline(config, engine=eng)                   # retrieval local, generation remote

    Of the optional backend capabilities (``engine.backend``) it implements none: the server's cache is
    not this process's to probe, reset or warm, it takes no chunk spans, and a public prefix is the
    server's own policy.
    """

    capabilities = BackendCapabilities()

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        tokenizer: Any = None,
        prompt_format: PromptFormat = "auto",
        max_context: int | None = None,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if prompt_format not in _FORMATS:
            raise ValueError(f"prompt_format must be one of {_FORMATS}, got {prompt_format!r}")
        if not timeout_s > 0 or not connect_timeout_s > 0:
            raise ValueError(f"timeouts must be > 0, got {timeout_s!r} and {connect_timeout_s!r}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model_id = model
        self.prompt_format: PromptFormat = prompt_format
        self.timeout_s = float(timeout_s)
        self._tokenizer = None if tokenizer is None or isinstance(tokenizer, str) else tokenizer
        self._tokenizer_source = tokenizer if isinstance(tokenizer, str) else model
        self._max_context = max_context
        self._max_context_known = max_context is not None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s))
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    # ---- what the Pipeline reads ---------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The local tokenizer (loaded on first use from ``tokenizer=`` or the model name)."""
        if self._tokenizer is None:
            self._tokenizer = _load_tokenizer(self._tokenizer_source)
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    @property
    def max_context(self) -> int | None:
        """The served model's context length: given, or asked once of the server (None if it won't say)."""
        if not self._max_context_known:
            self._max_context = self._discover_max_context()
            self._max_context_known = True
        return self._max_context

    # ---- Engine interface -------------------------------------------------------------------
    def encode(self, prompt: PromptInput) -> list[int]:
        """Token ids with the local tokenizer, as ``Engine.encode`` computes them."""
        kind, value = _classify(prompt)
        if kind == "text":
            return list(self.tokenizer.encode(value, add_special_tokens=True))
        if kind == "messages":
            ids = self.tokenizer.apply_chat_template(
                value, add_generation_prompt=True, tokenize=True, return_dict=False
            )
            return [int(t) for t in ids]
        return list(value)

    def generate(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        namespace: str = "",
        public_prefix: int = 0,
        reuse: str | ChunkReuse | None = None,
        chunk_spans: Sequence[tuple[int, int]] | None = None,
        chunk_context: Sequence[int] | None = None,
    ) -> GenerationResult:
        """Run one request to completion (raises EngineError, ValueError or QueueFullError)."""
        stream = self.stream(
            prompt,
            params,
            namespace=namespace,
            public_prefix=public_prefix,
            reuse=reuse,
            chunk_spans=chunk_spans,
            chunk_context=chunk_context,
        )
        return final_result(stream, self.base_url)

    def stream(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        namespace: str = "",
        public_prefix: int = 0,
        reuse: str | ChunkReuse | None = None,
        chunk_spans: Sequence[tuple[int, int]] | None = None,
        chunk_context: Sequence[int] | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """Yield text deltas as the server streams them; the last event carries the result.
        Closing the iterator early closes the connection (the server cancels the request).

        Prefix reuse only: ``reuse`` other than None/"prefix" is refused (an OpenAI-compatible server
        takes no chunk spans); ``chunk_spans`` and ``chunk_context`` are accepted and unused. ``public_prefix`` must be 0
        (``capabilities.public_prefix`` is off: sharing across tenants is the server's decision)."""
        if not isinstance(namespace, str):
            raise ValueError(f"namespace must be a string, got {type(namespace).__name__}")
        if public_prefix != 0:
            raise ValueError(
                f"public_prefix={public_prefix!r}: a remote engine does not share prefixes across tenants "
                "(its server decides that); leave it at 0"
            )
        if reuse not in (None, "prefix"):
            raise ValueError(
                f"reuse={reuse!r}: a remote engine reuses exact prefixes only (chunk reuse needs a local "
                "Engine); use reuse='prefix' or leave it unset"
            )
        kind, value = _classify(prompt)
        body = _sampling_body(self.model_id, params or SamplingParams(), namespace)
        return self._events(kind, value, body)

    def stats(self) -> dict[str, Any]:
        """The server's cache stats when it is a prefixrag server (``GET /v1/cache``), else ``{}``."""
        try:
            reply = self._client.get("/v1/cache")
            return dict(reply.json()) if reply.status_code == 200 else {}
        except (httpx.HTTPError, ValueError, TypeError):
            return {}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one request ----------------------------------------------------------------------------
    def _events(self, kind: str, value: Any, body: dict[str, Any]) -> Generator[StreamEvent, None, None]:
        request_id = uuid.uuid4().hex
        path, payload = self._payload(kind, value, body)
        try:
            yield from self._post(path, payload, request_id, prompt_len=_prompt_len(kind, value))
        except _PromptRefused:
            log.warning("%s refuses token-id prompts; sending text from now on", self.base_url)
            self.prompt_format = "text"
            path, payload = self._payload(kind, value, body)
            yield from self._post(path, payload, request_id, prompt_len=_prompt_len(kind, value))

    def _payload(self, kind: str, value: Any, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if kind == "messages":
            return "/v1/chat/completions", {**body, "messages": value}
        if kind == "ids" and self.prompt_format == "text":
            return "/v1/completions", {
                **body,
                "prompt": self.tokenizer.decode(value, skip_special_tokens=False),
            }
        return "/v1/completions", {**body, "prompt": value}

    def _post(
        self, path: str, payload: dict[str, Any], request_id: str, *, prompt_len: int
    ) -> Iterator[StreamEvent]:
        start = time.perf_counter()
        acc = _Accumulator(start=start, request_id=request_id)
        headers = {"X-Request-Id": request_id, "Accept": "text/event-stream"}
        where = f"{self.base_url}{path}"
        try:
            with self._client.stream("POST", path, json=payload, headers=headers) as reply:
                if reply.status_code != 200:
                    self._raise_for(reply, payload)
                acc.request_id = reply.headers.get("x-request-id") or request_id
                for chunk in _chunks(reply, where):
                    delta = acc.add(chunk)
                    if delta is not None:
                        yield delta
        except httpx.TimeoutException as exc:
            raise EngineError(
                f"{where} timed out: no response within {self.timeout_s:g} s ({type(exc).__name__})"
            ) from exc
        except httpx.ConnectError as exc:
            raise EngineError(f"cannot reach {self.base_url}: is the server running? ({exc})") from exc
        except httpx.HTTPError as exc:
            raise EngineError(f"{where} failed mid-response: {type(exc).__name__}: {exc}") from exc
        result = acc.result(prompt_len)
        yield StreamEvent("", [], result.request_id, finish_reason=result.finish_reason, result=result)

    def _raise_for(self, reply: httpx.Response, payload: dict[str, Any]) -> None:
        reply.read()
        message = _error_message(reply)
        status = reply.status_code
        if status == 429:
            raise QueueFullError(0, _retry_after(reply))
        token_prompt = isinstance(payload.get("prompt"), list)
        if token_prompt and self.prompt_format == "auto" and status in (400, 422) and "prompt" in message:
            raise _PromptRefused(message)
        if 400 <= status < 500:
            raise ValueError(f"{self.base_url} rejected the request ({status}): {message}")
        raise EngineError(f"{self.base_url} failed ({status}): {message}")

    def _discover_max_context(self) -> int | None:
        """``max_context_length`` of SGLang's (and prefixrag's) /get_model_info, or vLLM's
        ``max_model_len`` in /v1/models."""
        for path, read in (
            ("/get_model_info", lambda d: d.get("max_context_length")),
            ("/v1/models", lambda d: next((m.get("max_model_len") for m in d.get("data", [])), None)),
        ):
            try:
                reply = self._client.get(path)
                value = read(reply.json()) if reply.status_code == 200 else None
            except (httpx.HTTPError, ValueError, TypeError, AttributeError):
                continue
            if isinstance(value, int) and value > 0:
                return value
        return None


@dataclass
class _Accumulator:
    """Folds OpenAI stream chunks (or one non-streamed response) into deltas and a result."""

    start: float
    request_id: str
    text: list[str] = field(default_factory=list)
    first_at: float | None = None
    finish: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    done: bool = False

    def add(self, chunk: dict[str, Any]) -> StreamEvent | None:
        if chunk is _DONE:
            self.done = True
            return None
        self.usage = chunk.get("usage") or self.usage
        if chunk.get("object") in ("chat.completion", "text_completion") and "choices" in chunk:
            self.done = True  # a server that ignored stream=true answered with the whole response
        delta = ""
        for choice in chunk.get("choices") or []:
            delta += _choice_text(choice)
            self.finish = choice.get("finish_reason") or self.finish
        if not delta:
            return None
        self.text.append(delta)
        if self.first_at is None:  # TTFT: the first visible text, not a role-only chunk
            self.first_at = time.perf_counter()
            return StreamEvent(delta, [], self.request_id, ttft_s=self.first_at - self.start)
        return StreamEvent(delta, [], self.request_id)

    def result(self, prompt_len: int) -> GenerationResult:
        if not self.done:
            raise EngineError("the server closed the stream before 'data: [DONE]' (response cut short)")
        now = time.perf_counter()
        details = self.usage.get("prompt_tokens_details") or {}
        completion = self.usage.get("completion_tokens")
        return GenerationResult(
            text="".join(self.text),
            token_ids=[],
            prompt_tokens=int(self.usage.get("prompt_tokens") or prompt_len),
            cached_tokens=int(details.get("cached_tokens") or 0),
            ttft_s=(self.first_at or now) - self.start,
            total_s=now - self.start,
            finish_reason=self.finish or "stop",
            request_id=self.request_id,
            reported_completion_tokens=int(completion) if completion is not None else None,
        )


class _PromptRefused(Exception):
    """The server refused a token-id prompt (auto mode retries with text)."""


_DONE: dict[str, Any] = {}  # sentinel chunk for "data: [DONE]"


def _classify(prompt: PromptInput) -> tuple[str, Any]:
    """("text", str) | ("messages", list[dict]) | ("ids", list[int]); ValueError for anything else."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt is empty")
        return "text", prompt
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError(
            f"prompt must be a non-empty string, list of token ids or list of chat messages, got {prompt!r:.80}"
        )
    items = list(prompt)
    if all(isinstance(m, dict) for m in items):
        return "messages", items
    if all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in items):
        return "ids", [int(t) for t in items]
    raise ValueError("prompt must be a string, a list of token ids (ints >= 0), or a list of chat messages")


def _prompt_len(kind: str, value: Any) -> int:
    return len(value) if kind == "ids" else 0


def _sampling_body(model: str, params: SamplingParams, namespace: str) -> dict[str, Any]:
    """OpenAI fields, plus vLLM-style extensions only where they differ from the default (a strict
    OpenAI server refuses fields it does not know)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    extensions = {
        "stop": params.stop or None,
        "seed": params.seed,
        "top_k": params.top_k or None,
        "repetition_penalty": params.repetition_penalty if params.repetition_penalty != 1.0 else None,
        "stop_token_ids": params.stop_token_ids or None,
        "ignore_eos": params.ignore_eos or None,
        "cache_salt": namespace or None,  # vLLM's name for a prefix-cache isolation key
    }
    return body | {k: v for k, v in extensions.items() if v is not None}


def _chunks(reply: httpx.Response, where: str) -> Iterator[dict[str, Any]]:
    """JSON objects of an OpenAI-style SSE stream, then ``_DONE``; a plain JSON body as one chunk."""
    if reply.headers.get("content-type", "").startswith("application/json"):
        reply.read()
        yield _parse_json(reply.text, where)
        return
    for line in reply.iter_lines():
        if not line or line.startswith((":", "event:", "id:", "retry:")):
            continue
        if not line.startswith("data:"):
            raise EngineError(f"{where} sent malformed JSON, not an event stream: {line[:80]!r}")
        payload = line[5:].strip()
        if payload == "[DONE]":
            yield _DONE
            return
        yield _parse_json(payload, where)


def _parse_json(payload: str, where: str) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise EngineError(f"{where} sent malformed JSON: {payload[:80]!r}") from exc
    if not isinstance(chunk, dict):
        raise EngineError(f"{where} sent malformed JSON: expected an object, got {payload[:80]!r}")
    if "error" in chunk:
        raise EngineError(f"{where} reported an error: {_describe_error(chunk['error'])}")
    return chunk


def _choice_text(choice: Any) -> str:
    if not isinstance(choice, dict):
        return ""
    if "delta" in choice:
        return str((choice.get("delta") or {}).get("content") or "")
    if "message" in choice:
        return str((choice.get("message") or {}).get("content") or "")
    return str(choice.get("text") or "")


def _error_message(reply: httpx.Response) -> str:
    try:
        return _describe_error(reply.json()["error"])
    except (ValueError, KeyError, TypeError):
        return reply.text[:300].strip() or reply.reason_phrase


def _describe_error(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


def _retry_after(reply: httpx.Response) -> float:
    try:
        return float(reply.headers.get("Retry-After", 1))
    except ValueError:
        return 1.0


def _load_tokenizer(source: str) -> Any:
    from engine.models import load_tokenizer

    try:
        return load_tokenizer(source)
    except Exception as exc:
        raise ValueError(
            f"RemoteEngine needs a local tokenizer for token-level prompts and could not load one for "
            f"{source!r} ({type(exc).__name__}: {exc}); pass tokenizer= (a tokenizer, HF dir or registry name)"
        ) from exc
