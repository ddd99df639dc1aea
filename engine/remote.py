"""RemoteEngine: the Engine interface over any OpenAI-compatible server.

Retrieval and prompt assembly stay local; generation goes to a prefixrag replica, a router in front
of several, vLLM, SGLang or llama.cpp's server. Token-id prompts are sent to ``/v1/completions`` (the
assembler's stable-first layout reaches the server's own prefix cache unchanged); chat messages go
to ``/v1/chat/completions``. ``cached_tokens`` comes from ``usage.prompt_tokens_details`` when the
server reports it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from engine.request import EngineError, GenerationResult, QueueFullError, StreamEvent, final_result
from engine.sampling import SamplingParams

Prompt = str | Sequence[int] | Sequence[dict[str, Any]]


class RemoteEngine:
    """Generate through an OpenAI-compatible HTTP API, with the same calls as :class:`engine.Engine`.

    Example:
        >>> eng = RemoteEngine("http://127.0.0.1:8000", model="smollm2-135m-instruct")
        >>> r = eng.generate([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=8))
        >>> r.text, r.cached_tokens                                   # doctest: +SKIP
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        tokenizer: Any = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model_id = model
        self.tokenizer = tokenizer
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    # ---- Engine interface -------------------------------------------------------------------
    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids with the local tokenizer (needed only for token-level prompt assembly)."""
        if self.tokenizer is None:
            raise ValueError("RemoteEngine.encode needs a tokenizer: pass tokenizer= when creating it")
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        items = list(prompt)
        if items and all(isinstance(m, dict) for m in items):
            return list(
                self.tokenizer.apply_chat_template(items, add_generation_prompt=True, return_dict=False)
            )
        return [t for t in items if isinstance(t, int)]

    def generate(
        self, prompt: Prompt, params: SamplingParams | None = None, *, namespace: str = ""
    ) -> GenerationResult:
        return final_result(self.stream(prompt, params, namespace=namespace), self.base_url)

    def stream(
        self, prompt: Prompt, params: SamplingParams | None = None, *, namespace: str = ""
    ) -> Iterator[StreamEvent]:
        params = params or SamplingParams()
        path, body = self._request_body(prompt, params, namespace)
        return self._events(path, body)

    def stats(self) -> dict[str, Any]:
        """The server's cache stats when it is a prefixrag server, else an empty dict."""
        try:
            reply = self._client.get("/v1/cache")
            return dict(reply.json()) if reply.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ---------------------------------------------------------------------------
    def _request_body(
        self, prompt: Prompt, params: SamplingParams, namespace: str
    ) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "model": self.model_id,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if params.stop:
            body["stop"] = params.stop
        if params.seed is not None:
            body["seed"] = params.seed
        if namespace:
            body["cache_salt"] = namespace  # vLLM's name for a prefix-cache isolation key
        if isinstance(prompt, str):
            return "/v1/completions", {**body, "prompt": prompt}
        items = list(prompt)
        if items and all(isinstance(m, dict) for m in items):
            return "/v1/chat/completions", {**body, "messages": items}
        ids = [t for t in items if isinstance(t, int) and not isinstance(t, bool)]
        if items and len(ids) == len(items):
            return "/v1/completions", {**body, "prompt": ids}
        raise ValueError("prompt must be a string, a list of token ids, or a list of chat messages")

    def _events(self, path: str, body: dict[str, Any]) -> Iterator[StreamEvent]:
        start = time.perf_counter()
        text: list[str] = []
        first_at: float | None = None
        finish = None
        usage: dict[str, Any] = {}
        request_id = ""
        try:
            with self._client.stream("POST", path, json=body) as reply:
                if reply.status_code != 200:
                    self._raise_for(reply)
                for chunk in _sse_json(reply.iter_lines(), self.base_url):
                    request_id = chunk.get("id", request_id)
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        delta = _choice_text(choice)
                        finish = choice.get("finish_reason") or finish
                        if not delta:
                            continue
                        if first_at is None:  # TTFT: the first visible text, not a role-only chunk
                            first_at = time.perf_counter()
                            yield StreamEvent(delta, [], request_id, ttft_s=first_at - start)
                        else:
                            yield StreamEvent(delta, [], request_id)
                        text.append(delta)
        except httpx.TimeoutException as exc:
            raise EngineError(f"{self.base_url} timed out: {exc}") from exc
        except httpx.TransportError as exc:
            raise EngineError(f"cannot reach {self.base_url}: {exc}") from exc
        now = time.perf_counter()
        details = usage.get("prompt_tokens_details") or {}
        result = GenerationResult(
            text="".join(text),
            token_ids=[],
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            cached_tokens=int(details.get("cached_tokens") or 0),
            ttft_s=(first_at or now) - start,
            total_s=now - start,
            finish_reason=finish or "stop",
            request_id=request_id,
            reported_completion_tokens=int(usage.get("completion_tokens") or 0),
        )
        yield StreamEvent("", [], request_id, finish_reason=result.finish_reason, result=result)

    def _raise_for(self, reply: httpx.Response) -> None:
        reply.read()
        try:
            message = reply.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = reply.text[:200]
        if reply.status_code == 429:
            raise QueueFullError(0, float(reply.headers.get("Retry-After", 1)))
        if 400 <= reply.status_code < 500:
            raise ValueError(f"{self.base_url} rejected the request ({reply.status_code}): {message}")
        raise EngineError(f"{self.base_url} failed ({reply.status_code}): {message}")


def _sse_json(lines: Iterator[str], source: str) -> Iterator[dict[str, Any]]:
    """JSON payloads of an OpenAI-style SSE stream, up to ``data: [DONE]``."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            chunk = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise EngineError(f"{source} sent malformed JSON in its stream: {payload[:80]!r}") from exc
        if not isinstance(chunk, dict):
            raise EngineError(f"{source} sent a non-object chunk: {payload[:80]!r}")
        if "error" in chunk:
            raise EngineError(f"{source} reported an error: {chunk['error']}")
        yield chunk


def _choice_text(choice: dict[str, Any]) -> str:
    if "delta" in choice:
        return str((choice.get("delta") or {}).get("content") or "")
    return str(choice.get("text") or "")
