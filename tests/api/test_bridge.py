"""rag/api/bridge.py: an engine stream reaches asyncio without a worker thread (the engine tells the
loop of each event), with the same events as iterating it directly; other iterators run their
``next()`` in worker threads; leaving early cancels the engine request and releases its lock."""

from __future__ import annotations

from contextlib import aclosing

import anyio

from engine import Engine, SamplingParams
from rag.api.bridge import iterate_in_thread
from tests.api.helpers import wait_until

PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPT = "Name three rivers of Europe."


def _collect(it, limiter: anyio.CapacityLimiter | None = None) -> list:
    async def main() -> list:
        async with aclosing(iterate_in_thread(it, limiter)) as events:
            return [event async for event in events]

    return anyio.run(main)


def test_an_engine_stream_needs_no_worker_thread_and_gives_the_same_events(engine: Engine):
    direct = list(engine.stream(PROMPT, PARAMS))

    async def main() -> list:
        # every worker thread of the limiter is taken: a per-item thread would wait forever
        limiter = anyio.CapacityLimiter(1)
        await limiter.acquire()
        try:
            with anyio.fail_after(60):
                events = []
                async with aclosing(iterate_in_thread(engine.stream(PROMPT, PARAMS), limiter)) as stream:
                    async for event in stream:
                        events.append(event)
                        if event.finish_reason is not None:
                            break
                return events
        finally:
            limiter.release()

    watched = anyio.run(main)
    assert [e.token_ids for e in watched] == [e.token_ids for e in direct]
    assert "".join(e.text for e in watched) == "".join(e.text for e in direct)
    assert watched[-1].finish_reason == direct[-1].finish_reason == "length"


def test_other_iterators_run_in_worker_threads():
    assert _collect(iter(range(5))) == [0, 1, 2, 3, 4]


def test_leaving_an_engine_stream_early_cancels_it_and_releases_the_lock(engine: Engine):
    stream = engine.stream(PROMPT, SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))

    async def main() -> int:
        seen = 0
        async with aclosing(iterate_in_thread(stream)) as events:
            async for _ in events:
                seen += 1
                if seen == 3:
                    break
        return seen

    before = engine.stats()["cancelled"]
    assert anyio.run(main) == 3
    assert stream.request.done.wait(30)
    assert wait_until(lambda: engine.stats()["cancelled"] == before + 1 and engine.stats()["running"] == 0)
    assert engine.cache.stats().protected_bytes == 0
    assert stream.request.output_ids and len(stream.request.output_ids) < 200
