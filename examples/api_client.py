"""Talk to a running `prefixrag serve`: add a document, ask (streamed), then chat through the openai client.

Shows what the prefix cache buys over HTTP: the second request with the same prefix reports
``cached_tokens`` and a shorter TTFT.

    prefixrag serve --port 8000 &                      # in another terminal
    python examples/api_client.py --url http://127.0.0.1:8000 [--key sk-...]
"""

from __future__ import annotations

import argparse
import json
import time

import httpx


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--key", default=None, help="bearer key, when the server has PREFIXRAG_API_KEYS")
    return p.parse_args(argv)


def ask_streamed(client: httpx.Client, question: str) -> None:
    """POST /v1/ask with stream=true: print deltas as they come, then usage and timings."""
    started = time.perf_counter()
    first = None
    with client.stream(
        "POST", "/v1/ask", json={"question": question, "stream": True, "max_tokens": 48}
    ) as reply:
        reply.raise_for_status()
        kind = ""
        for line in reply.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if kind == "delta":
                    first = first or time.perf_counter()
                    print(data["text"], end="", flush=True)
                elif kind == "sources":
                    print(f"[sources: {', '.join(s['doc_id'] for s in data['sources']) or 'none'}]")
                elif kind == "usage":
                    print(
                        f"\n  cached {data['cached_tokens']} of {data['prompt_tokens']} prompt tokens", end=""
                    )
    print(f", first token after {1000 * ((first or time.perf_counter()) - started):.0f} ms")


def wait_ready(client: httpx.Client, timeout_s: float = 300) -> None:
    """Poll /readyz until the model and the pipeline are loaded (the server may still be starting)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{client.base_url} is not ready after {timeout_s:.0f} s")
        time.sleep(1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    with httpx.Client(base_url=args.url, headers=headers, timeout=120) as client:
        wait_ready(client)
        doc = {
            "id": "lighthouse.md",
            "text": "The Kerbrat lighthouse was built in 1881 and is 42 metres tall.",
        }
        added = client.post("/v1/documents", json=[doc])
        added.raise_for_status()
        print("added", added.json()["ids"])
        for _ in range(2):
            ask_streamed(client, "How tall is the Kerbrat lighthouse?")

    from openai import OpenAI

    oai = OpenAI(base_url=args.url + "/v1", api_key=args.key or "unused")
    model = oai.models.list().data[0].id
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name three colours."},
    ]
    for _ in range(2):
        r = oai.chat.completions.create(model=model, messages=messages, max_tokens=24, temperature=0)
        cached = r.usage.prompt_tokens_details.cached_tokens if r.usage.prompt_tokens_details else 0
        print(f"chat: {r.choices[0].message.content!r} (cached {cached}/{r.usage.prompt_tokens})")
    print("hit rate:", client_hit_rate(args.url, headers))


def client_hit_rate(url: str, headers: dict[str, str]) -> str:
    stats = httpx.get(url + "/v1/cache", headers=headers).json()
    return f"{100 * stats['cache']['hit_rate']:.1f}%"


if __name__ == "__main__":
    main()
