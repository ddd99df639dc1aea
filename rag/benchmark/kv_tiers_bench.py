"""KV tiers benchmark: bytes per token and fidelity of each KV storage format, and TTFT from the disk
tier after a restart against RAM-warm and cold, with the disk's read throughput, the break-even prefix
length, and the TTFT at 0% hits with the disk tier writing; then the remote tier through Redis
(rag.benchmark.kv_remote_bench).

Everything is measured side by side in one process, interleaved, and reported as medians and ratios.
A "restart" is a fresh Engine (empty RAM cache, a new disk tier that scans the folder) over the same
loaded weights; the block files it reads are dropped from the page cache first (``posix_fadvise
DONTNEED`` on each file, which needs no privileges and leaves other processes' cached files alone), so
the read is a cold read from the device.

Example:
    >>> out = run_kv_tiers_bench(repeats=2, fidelity_prompts=2)          # doctest: +SKIP
    >>> out["disk_ttft"]["float32"]["disk_over_ram"]                     # doctest: +SKIP
    1.3
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv import BLOCK_TOKENS
from engine.kv.codec import KV_DTYPES, KVGeometry, make_codec
from engine.models import DEFAULT_MODEL, LoadedModel, load_model
from engine.paths import prefixrag_home
from engine.sampling import SamplingParams
from rag.benchmark.engine_bench import QUESTIONS, rag_context, rag_messages
from rag.benchmark.fidelity import kl_divergence

ONE_TOKEN = SamplingParams(max_tokens=1)


def run_kv_tiers_bench(
    *,
    model: str = DEFAULT_MODEL,
    loaded: LoadedModel | None = None,
    context_tokens: int = 1500,
    repeats: int = 3,
    disk_kv_dtypes: Sequence[str] = ("float32", "bfloat16", "int8"),
    fidelity_prompts: int = 6,
    fidelity_tokens: int = 16,
    break_even_lengths: Sequence[int] = (64, 256, 1024),
    zero_hit_requests: int = 4,
    working_set_tokens: int | None = None,
    remote: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """All figures of the KV tiers section as plain data (see the module docstring)."""
    say = progress or (lambda _msg: None)
    loaded = loaded or load_model(model)
    context = rag_context(loaded.tokenizer, context_tokens)
    prompts = [rag_messages(context, q) for q in QUESTIONS]
    geometry = KVGeometry.from_config(loaded.model.config)
    bytes_per_token = {kv: make_codec(kv, torch.float32).bytes_per_token(geometry) for kv in KV_DTYPES}
    out: dict[str, Any] = {"model": loaded.model_id, "bytes_per_token": bytes_per_token}
    if working_set_tokens:
        out["working_set"] = {
            "tokens": working_set_tokens,
            "gib": {kv: working_set_tokens * b / 2**30 for kv, b in bytes_per_token.items()},
        }
    say("KV formats: fidelity against float32 KV")
    out["fidelity"] = fidelity(loaded, prompts[:fidelity_prompts], fidelity_tokens)
    scratch = Path(tempfile.mkdtemp(prefix="kv-tiers-", dir=_scratch_root()))
    try:
        out["disk_ttft"] = {}
        for kv in disk_kv_dtypes:
            say(f"disk tier: TTFT after a restart ({kv} KV)")
            out["disk_ttft"][kv] = disk_ttft(loaded, prompts, kv, scratch / kv, repeats)
        say("disk tier: break-even prefix length")
        folder = scratch / "break-even"
        out["break_even"] = break_even(
            loaded, prompts[0], break_even_lengths, cold_files=folder, disk_cache_dir=folder
        )
        say("disk tier: TTFT at 0% hits while writing")
        out["zero_hit"] = zero_hit(loaded, prompts, zero_hit_requests, disk_cache_dir=scratch / "zero-hit")
        if remote:
            from rag.benchmark.kv_remote_bench import run_remote_section

            out["remote"] = run_remote_section(
                loaded, prompts, scratch / "remote", repeats, break_even_lengths, zero_hit_requests, say
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out["prompt_tokens"] = out["disk_ttft"][disk_kv_dtypes[0]]["prompt_tokens"] if disk_kv_dtypes else 0
    return out


def _scratch_root() -> Path:
    root = prefixrag_home() / "bench"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _engine(loaded: LoadedModel, **config: Any) -> Engine:
    return Engine(loaded.model, loaded.tokenizer, model_id=loaded.model_id, config=EngineConfig(**config))


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else math.nan


# ---- fidelity ------------------------------------------------------------------------------------


def fidelity(loaded: LoadedModel, prompts: Sequence[Any], tokens: int) -> dict[str, Any]:
    """Each kv_dtype against float32 KV on the same prompts: the reference's greedy answer is fed to
    both (teacher forcing); per position, KL(reference || kv_dtype) of the next-token distribution and
    whether the top token agrees. The greedy answer of a kv_dtype equals the reference's exactly when
    every position agrees, and its first divergence is the first disagreeing position."""
    engines = {kv: _engine(loaded, kv_dtype=kv, enable_prefix_cache=False) for kv in KV_DTYPES}
    try:
        ids = [engines["float32"].encode(p) for p in prompts]
        reference = [_greedy_logits(engines["float32"], p, tokens) for p in ids]
        out: dict[str, Any] = {"prompts": len(ids), "tokens": tokens}
        out["float32"] = {
            "mean_kl": 0.0,
            "max_kl": 0.0,
            "top1_agreement": 1.0,
            "first_token_agreement": 1.0,
            "greedy_exact_match": 1.0,
            "greedy_agreement": 1.0,
        }  # the reference itself
        for kv in KV_DTYPES[1:]:
            kls: list[float] = []
            agree: list[float] = []
            first: list[bool] = []
            exact: list[bool] = []
            prefix: list[float] = []
            for p, (ref_tokens, ref_logits) in zip(ids, reference):
                logits = _forced_logits(engines[kv], p, ref_tokens)
                kl = _kl(ref_logits, logits)
                top = [int(row.argmax()) == t for row, t in zip(logits, ref_tokens)]
                kls.extend(kl)
                agree.append(sum(top) / len(top))
                first.append(top[0])
                exact.append(all(top))
                prefix.append((top.index(False) if False in top else len(top)) / len(top))
            out[kv] = {
                "mean_kl": sum(kls) / len(kls),
                "max_kl": max(kls),
                "top1_agreement": sum(agree) / len(agree),
                "first_token_agreement": sum(first) / len(first),
                "greedy_exact_match": sum(exact) / len(exact),
                "greedy_agreement": sum(prefix) / len(prefix),
            }
        return out
    finally:
        for eng in engines.values():
            eng.close()


def _greedy_logits(engine: Engine, ids: list[int], tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    runner = engine.runner
    buf = runner.new_buffer(len(ids) + tokens)
    row = runner.prefill(ids, buf)
    chosen, rows = [], []
    for _ in range(tokens):
        rows.append(row)
        chosen.append(int(row.argmax()))
        row = runner.decode_step(chosen[-1], buf)
    return chosen, rows


def _forced_logits(engine: Engine, ids: list[int], forced: list[int]) -> list[torch.Tensor]:
    runner = engine.runner
    buf = runner.new_buffer(len(ids) + len(forced))
    rows = [runner.prefill(ids, buf)]
    for token in forced[:-1]:
        rows.append(runner.decode_step(token, buf))
    return rows


def _kl(reference: Sequence[torch.Tensor], other: Sequence[torch.Tensor]) -> list[float]:
    return [
        kl_divergence(torch.log_softmax(p.double(), -1), torch.log_softmax(q.double(), -1))
        for p, q in zip(reference, other)
    ]


# ---- TTFT: cold, RAM-warm, disk after a restart --------------------------------------------------


def disk_ttft(
    loaded: LoadedModel, prompts: Sequence[Any], kv_dtype: str, folder: Path, repeats: int
) -> dict[str, Any]:
    """Per round: caching off (cold), the prompt once into a disk-backed engine (written through),
    repeated there (RAM-warm), then repeated in a restarted engine on the same folder, its files cold
    (disk), and again in that engine after one unrelated request (disk, warm process)."""
    off = _engine(loaded, kv_dtype=kv_dtype, enable_prefix_cache=False)
    cold, ram, disk_first, disk, reads, phases = [], [], [], [], [], []
    prompt_tokens = cached_disk = cached_ram = 0
    try:
        off.generate(prompts[-1], ONE_TOKEN)  # warm-up
        for r in range(repeats):
            prompt, other = prompts[r % (len(prompts) - 1)], prompts[-1]
            ns = f"round-{r}"
            first = _engine(loaded, kv_dtype=kv_dtype, disk_cache_dir=folder)
            try:
                if r % 2 == 0:
                    cold.append(off.generate(prompt, ONE_TOKEN).ttft_s)
                written = first.generate(prompt, ONE_TOKEN, namespace=ns)
                if r % 2 == 1:
                    cold.append(off.generate(prompt, ONE_TOKEN).ttft_s)
                again = first.generate(prompt, ONE_TOKEN, namespace=ns)
                ram.append(again.ttft_s)
                assert first.disk is not None and first.disk.flush(600)
            finally:
                first.close()
            prompt_tokens, cached_ram = written.prompt_tokens, again.cached_tokens
            drop_page_cache(folder)
            restarted = _engine(loaded, kv_dtype=kv_dtype, disk_cache_dir=folder)
            try:
                hit = restarted.generate(prompt, ONE_TOKEN, namespace=ns)
                disk_first.append(hit.ttft_s)
                phases.append(hit.phases)
                cached_disk = hit.cached_tokens
                stats = restarted.stats()["disk"]
                reads.append((stats["read_bytes"], stats["read_s"], stats["read_blocks"]))
                restarted.generate(other, ONE_TOKEN, namespace="other")  # the process has served before
                restarted.reset_cache()
                drop_page_cache(folder)
                disk.append(restarted.generate(prompt, ONE_TOKEN, namespace=ns).ttft_s)
            finally:
                restarted.close()
    finally:
        off.close()
    read_bytes, read_s, blocks = (sum(x) for x in zip(*reads))
    return {
        "prompt_tokens": prompt_tokens,
        "cached_ram": cached_ram,
        "cached_disk": cached_disk,
        "cold_s": _median(cold),
        "ram_s": _median(ram),
        "disk_first_s": _median(disk_first),
        "disk_s": _median(disk),
        "disk_over_ram": _median(disk) / _median(ram),
        "disk_first_over_ram": _median(disk_first) / _median(ram),
        "cold_over_disk": _median(cold) / _median(disk),
        "cold_over_disk_first": _median(cold) / _median(disk_first),
        "read_mb_s": read_bytes / read_s / 1e6 if read_s else math.nan,
        "read_ms_per_block": 1000 * read_s / blocks if blocks else math.nan,
        "disk_phase_s": _median([p.get("tiers", 0.0) for p in phases]),
        "repeats": repeats,
    }


def drop_page_cache(folder: Path) -> int:
    """Evict the folder's block files from the page cache (they were fsynced, so the pages are clean);
    returns the files dropped."""
    count = 0
    for path in folder.rglob("*.kvb"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    return count


# ---- break-even and 0% hits ----------------------------------------------------------------------


def break_even(
    loaded: LoadedModel, prompt: Any, lengths: Sequence[int], *, cold_files: Path | None = None, **tier: Any
) -> dict[str, Any]:
    """Time to load L tokens from the tier ``tier`` configures (``disk_cache_dir`` or
    ``remote_cache_url``; read, verify, decode; ``cold_files``: the disk tier's files dropped from the
    page cache first) against computing them, for each prefix length L, on recycled buffers; the line
    fits give the length where they cross."""
    eng = _engine(loaded, **tier)
    try:
        ids = eng.encode(prompt)
        eng.generate(ids, ONE_TOKEN)
        assert eng.tiers.flush(600)
        runner, ns = eng.runner, eng._namespace("")
        buf = runner.new_buffer(len(ids))
        runner.prefill(ids[:BLOCK_TOKENS], buf)  # first touch of the buffer's pages
        rows = []
        for n in lengths:
            n = min(n // BLOCK_TOKENS * BLOCK_TOKENS, (len(ids) - 1) // BLOCK_TOKENS * BLOCK_TOKENS)
            loads, computes = [], []
            for _ in range(3):
                if cold_files is not None:
                    drop_page_cache(cold_files)
                buf.truncate(0)
                t0 = time.perf_counter()
                got = eng.tiers.extend(buf, ids, ns, limit=n)
                loads.append(time.perf_counter() - t0)
                assert got == n, (got, n)
                buf.truncate(0)
                t0 = time.perf_counter()
                runner.prefill(ids[:n], buf)
                computes.append(time.perf_counter() - t0)
            rows.append({"tokens": n, "load_s": _median(loads), "compute_s": _median(computes)})
    finally:
        eng.close()
    return {"rows": rows, "break_even_tokens": _crossing(rows)}


def _crossing(rows: list[dict[str, Any]]) -> float:
    """Tokens where the fitted load and compute lines cross (0: loading is faster at every length; inf:
    they never cross because computing costs less per token than loading)."""

    def fit(key: str) -> tuple[float, float]:
        xs, ys = [r["tokens"] for r in rows], [r[key] for r in rows]
        if len(xs) < 2:
            return 0.0, ys[0] / xs[0]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return my - slope * mx, slope

    (a_load, b_load), (a_comp, b_comp) = fit("load_s"), fit("compute_s")
    if b_comp <= b_load:
        return math.inf
    return max(0.0, (a_load - a_comp) / (b_comp - b_load))


def zero_hit(loaded: LoadedModel, prompts: Sequence[Any], requests: int, **tier: Any) -> dict[str, Any]:
    """TTFT of prompts nothing is cached for, back to back (the tier's writer overlaps the next prefill),
    with the tier ``tier`` configures on against caching off, interleaved."""
    tiered = _engine(loaded, **tier)
    off = _engine(loaded, enable_prefix_cache=False)
    on_s: list[float] = []
    off_s: list[float] = []
    try:
        off.generate(prompts[0], ONE_TOKEN)
        for i in range(requests):
            prompt = prompts[i % len(prompts)]
            pair = ((tiered, on_s), (off, off_s)) if i % 2 == 0 else ((off, off_s), (tiered, on_s))
            for eng, sink in pair:
                sink.append(eng.generate(prompt, ONE_TOKEN, namespace=f"fresh-{i}").ttft_s)
        assert tiered.tiers.flush(600)
        written = tiered.stats()[tiered.tiers.names[0]]
    finally:
        tiered.close()
        off.close()
    return {
        "requests": requests,
        "tier_on_s": _median(on_s),
        "caching_off_s": _median(off_s),
        "overhead": _median(on_s) / _median(off_s) - 1.0,
        "write_ms_per_block": 1000 * written["write_s"] / max(written["written_blocks"], 1),
        "write_cpu_ms_per_block": 1000 * written["write_cpu_s"] / max(written["written_blocks"], 1),
        "written_mb": written["written_bytes"] / 1e6,
    }


# ---- targets ------------------------------------------------------------------------------------


def kv_targets(section: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 15's targets (and issue 25's, for the remote tier), each with the measured value and whether
    it is met."""
    bpt = section["bytes_per_token"]
    out = [
        _target(
            "bfloat16 KV: half of float32's bytes per token",
            bpt["bfloat16"],
            bpt["bfloat16"] * 2 == bpt["float32"],
            f"{bpt['bfloat16']:,} vs {bpt['float32']:,} B/token",
        ),
        _target(
            "int8 KV <= 12 KB per token (scales included)",
            bpt["int8"],
            bpt["int8"] <= 12_000,
            f"{bpt['int8']:,} B/token",
        ),
    ]
    ws = section.get("working_set")
    if ws:
        out.append(
            _target(
                "the bench working set fits in <= 1.4 GiB of RAM with int8 KV",
                ws["gib"]["int8"],
                ws["gib"]["int8"] <= 1.4,
                f"{ws['tokens']:,} tokens",
            )
        )
    for kv, d in section.get("disk_ttft", {}).items():
        out.append(
            _target(
                f"{kv} KV: TTFT from disk after a restart <= 2x RAM-warm",
                d["disk_first_over_ram"],
                d["disk_first_over_ram"] <= 2.0,
                f"first request of the restarted engine {d['disk_first_s']:.3f} s vs RAM-warm "
                f"{d['ram_s']:.3f} s; after one other request {d['disk_s']:.3f} s",
            )
        )
        out.append(
            _target(
                f"{kv} KV: TTFT from disk after a restart >= 8x faster than cold",
                d["cold_over_disk_first"],
                d["cold_over_disk_first"] >= 8.0,
                f"cold {d['cold_s']:.2f} s",
            )
        )
    zero = section.get("zero_hit")
    if zero:
        out.append(
            _target(
                "no regression at 0% hits with the disk tier writing (<= 3%)",
                zero["overhead"],
                zero["overhead"] <= 0.03,
                f"{zero['tier_on_s']:.2f} s vs caching off {zero['caching_off_s']:.2f} s",
            )
        )
    from rag.benchmark.kv_remote_bench import remote_targets

    return out + remote_targets(section.get("remote"))


def _target(target: str, value: float, met: bool, note: str) -> dict[str, Any]:
    return {"target": target, "value": value, "met": bool(met), "note": note}
