"""The benchmark's exactness section at a small size: the native path's verdicts come from a fresh
process, the tiles' cost is measured side by side, the int8 kernels are checked and timed, and the
report renders all of it."""

from __future__ import annotations

from engine.exact_reuse import check_exact_reuse
from engine.fused import FusedLlamaRunner
from engine.quant.linear import int8_backend
from rag.benchmark.exactness_bench import run_exactness_bench
from rag.benchmark.exactness_report import TITLE, exactness_markdown
from rag.benchmark.limits import bfloat16_not_run


def test_the_section_measures_and_renders(loaded_model):
    sec = run_exactness_bench(loaded_model, repeats=1, context_tokens=200, all_paths=False)
    native = sec["paths"][0]
    assert native["name"] == "native" and "error" not in native, native
    fused = native["runners"]["fused float32"]
    # the child process reached the same verdict as this one, on the same code path
    runner = FusedLlamaRunner(loaded_model.model)
    assert fused["exact_reuse"] == check_exact_reuse(runner).exact
    # torch's Linears run calibrated row tiles; the native ones (any CPU with AVX2 and FMA) need none
    assert bool(fused["linear_tiles"]) is not runner.tiled and fused["linear_kernel"] == runner.linear_kernel
    # SDPA's query tiles are calibrated only where SDPA runs: the native attention kernel needs none
    assert (
        (fused["attention_tiles"] is None) if runner.attention is not None else 16 in fused["attention_tiles"]
    )
    assert native["int8_backend"] == int8_backend()
    not_run = bfloat16_not_run()  # bfloat16's cost is measured where the CPU multiplies it natively
    assert set(sec["cost"]) == ({"float32"} if not_run else {"float32", "bfloat16"})
    for dtype in sec["cost"]:
        ms = sec["cost"][dtype]["ms"]
        assert set(ms) == {"exact", "one call"} and all(v > 0 for m in ms.values() for v in m.values())
    kernels = {r["backend"]: r for r in sec["int8_kernels"]}
    assert kernels[int8_backend()]["exact"] is True
    text = exactness_markdown({"exactness_section": sec})
    assert not not_run or f"bfloat16: {not_run}." in text
    assert text.startswith(TITLE) and "| native" in text and "exact tiles" in text and "fbgemm" in text
    assert not runner.tiled or "none: native Linears, each row alone" in text
