"""KV tiers benchmark, the remote tier: a throwaway redis-server on 127.0.0.1, then

- replica B on another home (its own, empty disk tier) serving prompts replica A prefilled, through
  Redis: TTFT against B cold (caching off) and against A RAM-warm, B's read and A's write throughput;
- the break-even prefix length of loading from Redis against computing;
- TTFT at 0% hits with the remote tier writing, against caching off;
- the restart case: prompts that share a system prompt and then diverge, served by an engine with a
  disk tier, which restarts; the next such prompt from disk (and, on another home, through Redis),
  against RAM-warm and cold, with the tokens each reused.

Everything runs in this process over the same loaded weights, interleaved, medians of the rounds.
Where ``redis-server`` is absent the section says so (``available: False`` and the reason).

Example:
    >>> out = run_remote_section(loaded, prompts, Path("/tmp/r"), 1, (64, 256), 2, print)  # doctest: +SKIP
    >>> out["replica"]["remote_over_ram"]                                               # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine.engine import Engine
from engine.models import LoadedModel
from prefix_cache.keys import common_prefix_len
from rag.benchmark.kv_tiers_bench import (
    ONE_TOKEN,
    _engine,
    _median,
    _target,
    break_even,
    drop_page_cache,
    zero_hit,
)
from rag.benchmark.redis_server import RedisServer, redis_server_binary

MAXMEMORY = 4 << 30  # Redis's budget here: every round's blocks fit


def run_remote_section(
    loaded: LoadedModel,
    prompts: Sequence[Any],
    scratch: Path,
    repeats: int,
    break_even_lengths: Sequence[int],
    zero_hit_requests: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """The remote tier's figures (see the module docstring)."""
    if redis_server_binary() is None:
        return {
            "available": False,
            "reason": "redis-server is not on PATH (Debian: apt-get install redis-server)",
        }
    with RedisServer(scratch / "redis", maxmemory=MAXMEMORY) as server:
        url, client = server.url(), server.client()
        info: dict[str, Any] = client.info("server")  # type: ignore[assignment]  # a sync client
        out: dict[str, Any] = {"available": True, "redis": info.get("redis_version")}
        say("remote tier: replica B through Redis")
        out["replica"] = replica_ttft(loaded, prompts, url, scratch / "replica", repeats)
        client.flushall()
        say("remote tier: break-even prefix length")
        out["break_even"] = break_even(loaded, prompts[0], break_even_lengths, remote_cache_url=url)
        client.flushall()
        say("remote tier: TTFT at 0% hits while writing")
        out["zero_hit"] = zero_hit(loaded, prompts, zero_hit_requests, remote_cache_url=url)
        client.flushall()
        say("restart: a prompt that shares a system prompt with earlier ones")
        out["restart"] = restart_case(loaded, prompts, url, scratch / "restart", repeats)
        client.close()
    return out


def replica_ttft(
    loaded: LoadedModel, prompts: Sequence[Any], url: str, folder: Path, repeats: int
) -> dict[str, Any]:
    """Per round: caching off (cold); A (disk + Redis) computes the prompt, then repeats it (RAM-warm);
    B (another, empty disk + Redis) serves it as its very first request, and B' as its second (after
    one unrelated request: a warm process)."""
    off = _engine(loaded, enable_prefix_cache=False)
    cold, ram, first, warm, cached, reads, writes = [], [], [], [], [], [], []
    prompt_tokens = 0
    try:
        off.generate(prompts[-1], ONE_TOKEN)
        for r in range(repeats):
            prompt, other, ns = prompts[r % (len(prompts) - 1)], prompts[-1], f"round-{r}"
            a = _engine(loaded, disk_cache_dir=folder / f"a-{r}", remote_cache_url=url)
            try:
                cold.append(off.generate(prompt, ONE_TOKEN).ttft_s)
                prompt_tokens = a.generate(prompt, ONE_TOKEN, namespace=ns).prompt_tokens
                ram.append(a.generate(prompt, ONE_TOKEN, namespace=ns).ttft_s)
                assert a.tiers.flush(600)
                writes.append(_io(a.stats()["remote"], "written_bytes", "write_s", "written_blocks"))
            finally:
                a.close()
            hit, stats = _serve(loaded, url, folder / f"b-{r}", prompt, ns, None)
            first.append(hit.ttft_s)
            hit, stats = _serve(loaded, url, folder / f"b2-{r}", prompt, ns, other)
            warm.append(hit.ttft_s)
            cached.append(hit.cached_tokens)
            reads.append(_io(stats, "read_bytes", "read_s", "read_blocks"))
    finally:
        off.close()
    return {
        "prompt_tokens": prompt_tokens,
        "cached_remote": min(cached),
        "cold_s": _median(cold),
        "ram_s": _median(ram),
        "remote_first_s": _median(first),
        "remote_s": _median(warm),
        "remote_first_over_ram": _median(first) / _median(ram),
        "remote_over_ram": _median(warm) / _median(ram),
        "cold_over_remote_first": _median(cold) / _median(first),
        "cold_over_remote": _median(cold) / _median(warm),
        **_throughput("read", reads),
        **_throughput("write", writes),
        "repeats": repeats,
    }


def _serve(
    loaded: LoadedModel, url: str, home: Path, prompt: Any, ns: str, before: Any
) -> tuple[Any, dict[str, Any]]:
    """Replica B on ``home``: (``before`` first, in another namespace) then ``prompt``; its result and
    its remote tier's stats."""
    b = _engine(loaded, disk_cache_dir=home, remote_cache_url=url)
    try:
        if before is not None:
            b.generate(before, ONE_TOKEN, namespace="other")
            b.reset_cache()
        hit = b.generate(prompt, ONE_TOKEN, namespace=ns)
        stats = b.stats()["remote"]
        assert b.tiers.flush(600)
    finally:
        b.close()
    return hit, stats


def _io(stats: dict[str, Any], nbytes: str, seconds: str, blocks: str) -> tuple[float, float, float]:
    return float(stats[nbytes]), float(stats[seconds]), float(stats[blocks])


def _throughput(kind: str, samples: list[tuple[float, float, float]]) -> dict[str, float]:
    nbytes, seconds, blocks = (sum(x) for x in zip(*samples)) if samples else (0.0, 0.0, 0.0)
    return {
        f"{kind}_mb_s": nbytes / seconds / 1e6 if seconds else math.nan,
        f"{kind}_ms_per_block": 1000 * seconds / blocks if blocks else math.nan,
    }


def restart_case(
    loaded: LoadedModel, prompts: Sequence[Any], url: str, folder: Path, repeats: int
) -> dict[str, Any]:
    """Per round: an engine with a disk tier (and Redis) serves two prompts that share a system prompt,
    then a third (RAM-warm, reusing the system prompt); it restarts (a fresh engine on the same folder,
    the files dropped from the page cache) and serves a fourth as its first request (from disk); an
    engine on another home serves a fifth as its first request (through Redis); caching off is cold."""
    need = 5
    assert len(prompts) >= need + 1, "the restart case needs six prompts sharing a system prompt"
    off = _engine(loaded, enable_prefix_cache=False)
    rows: dict[str, list[float]] = {"cold": [], "ram": [], "disk": [], "remote": []}
    cached: dict[str, list[int]] = {"ram": [], "disk": [], "remote": []}
    system = 0
    try:
        off.generate(prompts[-1], ONE_TOKEN)
        for r in range(repeats):
            ids = [off.encode(prompts[(r + k) % len(prompts)]) for k in range(need)]
            system = min(common_prefix_len(ids[0], p, 0, len(p)) for p in ids[1:])  # what they all share
            home, ns = folder / f"home-{r}", f"round-{r}"
            rows["cold"].append(off.generate(ids[3], ONE_TOKEN).ttft_s)
            _record(rows, cached, "ram", _first_then(loaded, home, url, ns, ids[:2], ids[2]))
            drop_page_cache(home)
            _record(rows, cached, "disk", _first_then(loaded, home, None, ns, [], ids[3]))
            _record(rows, cached, "remote", _first_then(loaded, folder / f"other-{r}", url, ns, [], ids[4]))
    finally:
        off.close()
    ram = _median(rows["ram"])
    return {
        "system_tokens": system,
        "prompt_tokens": len(ids[3]),
        **{f"cached_{k}": min(v) for k, v in cached.items()},
        **{f"{k}_s": _median(v) for k, v in rows.items()},
        "disk_over_ram": _median(rows["disk"]) / ram,
        "remote_over_ram": _median(rows["remote"]) / ram,
        "cold_over_disk": _median(rows["cold"]) / _median(rows["disk"]),
        "repeats": repeats,
    }


def _first_then(
    loaded: LoadedModel, home: Path, url: str | None, ns: str, earlier: list[list[int]], probe: list[int]
) -> Any:
    """A fresh engine on ``home`` (and Redis at ``url``) serves ``earlier``, then ``probe``: its result."""
    eng: Engine = _engine(loaded, disk_cache_dir=home, remote_cache_url=url)
    try:
        for ids in earlier:
            eng.generate(ids, ONE_TOKEN, namespace=ns)
        result = eng.generate(probe, ONE_TOKEN, namespace=ns)
        assert eng.tiers.flush(600)
        return result
    finally:
        eng.close()


def _record(rows: dict[str, list[float]], cached: dict[str, list[int]], key: str, result: Any) -> None:
    rows[key].append(result.ttft_s)
    cached[key].append(result.cached_tokens)


def remote_targets(remote: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Issue 25's targets, each with the measured value and whether it is met."""
    if not remote or not remote.get("available"):
        return []
    rep, zero, rs = remote["replica"], remote["zero_hit"], remote["restart"]
    return [
        _target(
            "through Redis: replica B's TTFT on a prompt A prefilled <= 2x A's RAM-warm",
            rep["remote_first_over_ram"],
            rep["remote_first_over_ram"] <= 2.0,
            f"B's first request {rep['remote_first_s']:.3f} s vs A RAM-warm {rep['ram_s']:.3f} s",
        ),
        _target(
            "through Redis: replica B's TTFT >= 6x faster than B cold",
            rep["cold_over_remote_first"],
            rep["cold_over_remote_first"] >= 6.0,
            f"cold {rep['cold_s']:.2f} s, {rep['prompt_tokens']:,} tokens",
        ),
        _target(
            "restart: a prompt sharing a system prompt reuses it to its last token, <= 2x RAM-warm",
            rs["disk_over_ram"],
            rs["disk_over_ram"] <= 2.0 and rs["cached_disk"] >= rs["system_tokens"],
            f"{rs['cached_disk']:,} of {rs['system_tokens']:,} shared tokens from disk",
        ),
        _target(
            "0% hits with the remote tier writing: <= 3% over caching off",
            zero["overhead"],
            zero["overhead"] <= 0.03,
            f"{zero['tier_on_s']:.2f} s vs {zero['caching_off_s']:.2f} s",
        ),
    ]
