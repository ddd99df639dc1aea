"""The body of `prefixrag bench` (rag/cli.py only declares the options and delegates here)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from rag.benchmark.config import FULL_RUN, BenchConfig


def parse_skews(text: str) -> tuple[float, ...]:
    """'0.6, 1.0,1.4' -> (0.6, 1.0, 1.4); typer.BadParameter for anything else.

    >>> parse_skews("0.6, 1,1.4")
    (0.6, 1.0, 1.4)
    """
    try:
        values = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise typer.BadParameter(f"--skews takes comma-separated numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise typer.BadParameter(f"--skews needs at least one skew >= 0, got {text!r}")
    return values


def bench_config(quick: bool, options: dict[str, Any]) -> BenchConfig:
    """The run's config from the command's options (None: the mode's default); ValueError if invalid.

    >>> bench_config(False, {"full": True, "quality_questions": 30}).quality_budgets
    (0.1, 0.2, 0.3)
    """
    special = ("samples", "skews", "full")
    overrides = {k: v for k, v in options.items() if v is not None and k not in special}
    if options.get("full"):
        overrides = {**FULL_RUN, **overrides}  # a flag given beside it still wins
    if options.get("samples") is not None:
        overrides["baseline_samples"] = options["samples"]
    if options.get("skews") is not None:
        overrides["skews"] = parse_skews(options["skews"])
    return BenchConfig.quick_run(**overrides) if quick else BenchConfig(**overrides)


def bench_command(
    console: Console, *, quick: bool, out: Path, report_only: bool = False, **options: Any
) -> None:
    """Build the config from the given options (None: the mode's default), run, print the headline."""
    from rag.benchmark.run import run_benchmark

    if report_only:
        from rag.benchmark.report import rerender

        if not (out / "results.json").is_file():
            console.print(f"[red]error:[/] --report-only needs {out / 'results.json'} from an earlier run")
            raise typer.Exit(2)
        rerender(out)
        console.print(f"report: {out / 'report.md'} (redrawn from {out / 'results.json'})")
        return

    try:
        config = bench_config(quick, options)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    command = (
        "prefixrag " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else "prefixrag bench"
    )
    results = run_benchmark(config, out, console=console, command=command)
    h = results["headline"]
    ref, vs_off, vs_hf = h["reference"], h["reference"]["vs_off"], h["vs_transformers"]
    console.print(
        f"[bold]{h['reference_name']}[/]: mean TTFT {ref['ttft_s']['mean']:.2f} s over the stream; on the "
        f"{vs_off['requests']} requests caching off ran {vs_off['ttft_s']['mean']:.2f} s vs "
        f"{h['off']['ttft_s']['mean']:.2f} s ({vs_off['speedup_mean']:.2f}x), {vs_hf['speedup_mean']:.2f}x vs "
        f"transformers generate on its {vs_hf['requests']}; token hit rate "
        f"{100 * ref['token_hit_rate']:.1f}% ({100 * ref['of_oracle']:.0f}% of the oracle)"
    )
    for t in [*results["targets"], *(results.get("kv_section") or {}).get("targets", [])]:
        mark = "[green]met[/]" if t["met"] else "[red]missed[/]"
        console.print(f"  {mark}  {t['target']}")
    console.print(f"report: {out / 'report.md'}")
