"""Benchmark the radix prefix cache: per-call match / insert microseconds at 10k and 100k cached tokens.

Replays a seeded synthetic stream (Zipf-popular shared prefixes of 500-2,000 tokens plus unique
suffixes) the way the engine uses the cache (match capped at len-1 and locked, insert, unlock) and
prints median / p95 latencies and the token hit rate per eviction policy.

    python examples/bench_radix.py                       # both policies, 10k and 100k tokens, ~2 s
    python examples/bench_radix.py --levels 100000 --policy gdsf --requests 5000 --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rag.benchmark.radix_bench import run_radix_bench


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--levels", type=int, nargs="+", default=[10_000, 100_000], help="cache sizes in tokens")
    p.add_argument("--requests", type=int, default=2000, help="measured requests per level, after warm-up")
    p.add_argument("--policy", choices=["lru", "gdsf"], action="append", help="repeatable; default: both")
    p.add_argument("--bytes-per-token", type=int, default=64, help="value size per token (KV: 46080)")
    p.add_argument("--page-size", type=int, default=1)
    p.add_argument("--prefixes", type=int, default=64, help="distinct shared prefixes")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of prefix popularity")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    return p.parse_args(argv)


def format_table(figures: dict) -> str:
    head = (
        f"{'policy':6} {'cached':>8} {'hit rate':>8}  {'match µs p50/p95':>17}  {'insert µs p50/p95':>17}  "
    )
    head += f"{'2k-token match+insert µs p50/p95':>32}"
    rows = [head, "-" * len(head)]
    for policy, levels in figures["results"].items():
        for level, r in levels.items():
            m, i, f = r["match_us"], r["insert_us"], r["match_insert_2000_us"]
            rows.append(
                f"{policy:6} {int(level):>8,} {r['hit_rate']:>8.1%}  {m['median']:>8.1f}/{m['p95']:<8.1f}  "
                f"{i['median']:>8.1f}/{i['p95']:<8.1f}  {f['median']:>23.1f}/{f['p95']:<8.1f}"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    figures = run_radix_bench(
        levels=args.levels,
        requests=args.requests,
        policies=args.policy or ["lru", "gdsf"],
        bytes_per_token=args.bytes_per_token,
        page_size=args.page_size,
        num_prefixes=args.prefixes,
        zipf_s=args.zipf,
        seed=args.seed,
    )
    print(format_table(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
