"""The report's exactness section: the CPU, the code paths exercised and the engine's verdict on each,
what the exact prefill shapes cost, and the int8 kernels side by side.

Example:
    >>> print(exactness_markdown({}))
    ## Exact reuse on this CPU
    <BLANKLINE>
    Not run (`exactness_section` off).
"""

from __future__ import annotations

from typing import Any

from rag.benchmark.exactness_bench import SLOW_CALL_MS

TITLE = "## Exact reuse on this CPU"
_PHASES = (("cold", "cold prefill"), ("warm", "warm, 1-token suffix"), ("last_20", "warm, 20-token suffix"))


def exactness_markdown(res: dict[str, Any]) -> str:
    sec = res.get("exactness_section")
    if not sec:
        return f"{TITLE}\n\nNot run (`exactness_section` off)."
    lines = [
        TITLE,
        "",
        f"CPU: {sec['cpu']} ({', '.join(sec['flags']) or 'no AVX2'}), {sec['threads']} threads. Each code "
        "path ran the engine's self-check (`engine/exact_reuse.py`: a seeded 530-token prompt computed whole "
        "and cut at four points, logits and every layer's K/V compared bit for bit) in a fresh process "
        "with the libraries limited as the path says.",
        "",
        "| code path | runner | exact_reuse | matmul tiles (rows) | attention tiles |",
        "|---|---|---|---|---|",
    ]
    for path in sec["paths"]:
        label = f"{path['name']}: {path['description']}"
        if "error" in path:
            lines.append(f"| {label} | (the check did not run: {path['error']}) | | | |")
            continue
        extra = f"; torch {path.get('torch_capability')}, int8 backend {path.get('int8_backend') or 'none (refused)'}"
        for name, runner in path["runners"].items():
            tiles = "; ".join(f"{shape}: {sizes}" for shape, sizes in runner.get("linear_tiles", {}).items())
            if not tiles and str(runner.get("linear_kernel")).startswith("native"):
                tiles = "none: native Linears, each row alone"
            lines.append(
                f"| {label}{extra} | {name} | {_verdict(runner['exact_reuse'])} | {tiles or 'per Linear'} "
                f"| {runner.get('attention_tiles') or '-'} |"
            )
            label, extra = "", ""
    lines += ["", _cost_table(sec["cost"])]
    for dtype, why in sec.get("cost_not_run", {}).items():
        lines += ["", f"{dtype}: {why}."]
    lines += ["", _int8_table(sec["int8_kernels"])]
    return "\n".join(lines)


def _verdict(exact: bool | None) -> str:
    return {True: "**true**", False: "false", None: "not checked"}[exact]


def _cost_table(cost: dict[str, Any]) -> str:
    some = next(iter(cost.values()))
    lines = [
        f"What the exact shapes cost: the same {some['prompt_tokens']}-token prompt through the fused runner "
        "with the calibrated tiles and with each matmul and key-block span in one call "
        "(`exact_shapes=False`), rounds interleaved, medians (ms). Decode runs its rows in one call either way.",
        "",
        "| dtype | figure | exact tiles | one call | ratio |",
        "|---|---|---|---|---|",
    ]
    for dtype, c in cost.items():
        for key, label in _PHASES:
            lines.append(
                f"| {dtype} | {label} | {c['ms']['exact'][key]:.1f} | {c['ms']['one call'][key]:.1f} "
                f"| {c['ratio'][key]:.2f}x |"
            )
    return "\n".join(lines)


def _int8_table(rows: list[dict[str, Any]]) -> str:
    shapes = next((list(r["ms"]) for r in rows if r.get("available")), [])
    lines = [
        "int8 kernels on the model's projection shapes (rows x in x out; two activation digits per row, "
        "so twice the rows), each checked against float64 sums on seeded and worst-case operands; median ms "
        f"(the warm-up call itself where it took over {SLOW_CALL_MS:g} ms).",
        "",
        "| backend | exact integer sums | " + " | ".join(shapes) + " |",
        "|---|---|" + "---|" * len(shapes),
    ]
    for r in rows:
        if not r.get("available"):
            lines.append(f"| {r['backend']} | not in this torch | " + " | " * len(shapes))
            continue
        cells = " | ".join(f"{r['ms'][s]:.3f}" for s in shapes)
        lines.append(f"| {r['backend']} | {'yes' if r['exact'] else 'no: refused'} | {cells} |")
    return "\n".join(lines)
