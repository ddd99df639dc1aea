"""The report's remote-tier rows (rag.benchmark.kv_remote_bench)."""

from __future__ import annotations

import math
from typing import Any


def remote_rows(remote: dict[str, Any] | None) -> list[str]:
    """Markdown lines for the remote tier; one line saying why where it did not run."""
    if remote is None:
        return ["", "Remote tier (Redis): not run (the benchmark's `kv_remote` setting is off)."]
    if not remote.get("available"):
        return ["", f"Remote tier (Redis): not measured: {remote.get('reason', 'Redis unavailable')}."]
    rep, be, zero, rs = remote["replica"], remote["break_even"], remote["zero_hit"], remote["restart"]
    return [
        "",
        f"Remote tier (Redis {remote.get('redis', '?')} on 127.0.0.1, float32 KV): replica B on another "
        "home (its own, empty disk tier) serves a prompt replica A prefilled; medians of the rounds. "
        '"First request": B\'s very first request; "warm process": B after one unrelated request.',
        "",
        "| prompt | B cold | A RAM-warm | B through Redis, first request | warm process | / RAM-warm "
        "| cold / Redis | read | per block | write | per block |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {rep['prompt_tokens']:,} ({rep['cached_remote']:,} from Redis) | {_n(rep['cold_s'], '.2f')} s | "
        f"{_n(rep['ram_s'], '.3f')} s | {_n(rep['remote_first_s'], '.3f')} s | {_n(rep['remote_s'], '.3f')} s | "
        f"{_n(rep['remote_first_over_ram'], '.2f')}x / {_n(rep['remote_over_ram'], '.2f')}x | "
        f"{_n(rep['cold_over_remote_first'], '.1f')}x / {_n(rep['cold_over_remote'], '.1f')}x | "
        f"{_n(rep['read_mb_s'], ',.0f')} MB/s | {_n(rep['read_ms_per_block'], '.1f')} ms | "
        f"{_n(rep['write_mb_s'], ',.0f')} MB/s | {_n(rep['write_ms_per_block'], '.1f')} ms |",
        "",
        "Break-even prefix length through Redis: "
        + ", ".join(
            f"{r['tokens']} tokens: Redis {_n(r['load_s'], '.4f')} s vs compute {_n(r['compute_s'], '.3f')} s"
            for r in be["rows"]
        )
        + f"; the fitted lines cross {_crossing(be['break_even_tokens'])}.",
        "",
        f"0% hits with the remote tier writing, {zero['requests']} prompts back to back: TTFT "
        f"{_n(zero['tier_on_s'], '.2f')} s vs {_n(zero['caching_off_s'], '.2f')} s caching off "
        f"({_n(zero['overhead'], '+.1%')}); the writer spent {_n(zero['write_ms_per_block'], '.1f')} ms per "
        f"block ({_n(zero['write_cpu_ms_per_block'], '.1f')} ms CPU), {_n(zero['written_mb'], '.0f')} MB written.",
        "",
        f"Restart case: prompts sharing a {rs['system_tokens']:,}-token system prompt, then diverging. TTFT of "
        f"the next such prompt ({rs['prompt_tokens']:,} tokens): RAM-warm {_n(rs['ram_s'], '.3f')} s "
        f"({rs['cached_ram']:,} reused); after a restart, from disk {_n(rs['disk_s'], '.3f')} s "
        f"({rs['cached_disk']:,} reused, {_n(rs['disk_over_ram'], '.2f')}x RAM-warm); on another home "
        f"through Redis {_n(rs['remote_s'], '.3f')} s ({rs['cached_remote']:,} reused, "
        f"{_n(rs['remote_over_ram'], '.2f')}x); cold {_n(rs['cold_s'], '.2f')} s. The tiers reuse a prefix "
        "to its last shared token, also inside a 64-token block.",
    ]


def _crossing(tokens: float) -> str:
    if tokens == 0:
        return "nowhere in range: Redis is faster at every length"
    if math.isfinite(tokens):
        return f"at {tokens:.0f} tokens"
    return "nowhere: computing is cheaper per token than fetching"


def _n(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return format(value, spec)
