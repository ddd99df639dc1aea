"""The report's weights section: int8 vs float32 vs llama.cpp, int8's fidelity, its targets.

Example:
    >>> print(weights_markdown({}))
    ## int8 weights vs float32 vs llama.cpp
    <BLANKLINE>
    Not run (`weights_section` off).
"""

from __future__ import annotations

import math
from typing import Any

TITLE = "## int8 weights vs float32 vs llama.cpp"
ORDER = ("float32", "int8", "llama.cpp")
BATCH_BASELINE_TOK_S = 42.8  # float32 batched decode at 8 requests before int8 weights


def weights_markdown(res: dict[str, Any]) -> str:
    sec = res.get("weights_section")
    if not sec:
        return f"{TITLE}\n\nNot run (`weights_section` off)."
    systems = sec["systems"]
    names = [n for n in ORDER if n in systems]
    lines = [
        TITLE,
        "",
        f"The same {sec['prompt_tokens']}-token RAG prompts for every system, the same threads, "
        f"{sec['repeats']} interleaved rounds (the order rotating; medians). Each cell is that system's own "
        "measurement, timed by the same client code; an empty cell is a figure the system does not have.",
        "",
        "| figure | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    lines += [_row(label, [fmt(systems[n].get(key)) for n in names]) for label, key, fmt in _ROWS]
    lines.append(
        _row("batched decode, tok/s at 1 / 2 / 4 / 8 requests", [_batched(systems[n]) for n in names])
    )
    if "llama.cpp" not in systems:
        lines += [
            "",
            "llama.cpp was not measured: `llama-cpp-python` is not installed (`pip install 'prefixrag[llamacpp]'`).",
        ]
    else:
        lines += [
            "",
            "llama.cpp runs the bundled Q4_1 GGUF (the float32 weights are its de-quantized copy) through "
            "llama-cpp-python: TTFT through its completion API with `LlamaRAMCache`, cached tokens are the "
            "prompt tokens it did not evaluate, answers through its token generator (end of sequence ignored, "
            "as for the engine); it decodes one sequence at a time, so it has no batched figure. Its KV per "
            "prompt is the size of the state it saves for each cached prompt (each stores its whole prompt); "
            "the engine's is its cache's bytes per prompt served (a shared context is held once).",
        ]
    lines += ["", *_fidelity(sec["fidelity"]), "", *_targets(sec)]
    return "\n".join(lines)


def _row(label: str, cells: list[str]) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def _s(v: Any) -> str:
    return "" if _missing(v) else f"{v:.3f} s"


def _ms(v: Any) -> str:
    return "" if _missing(v) else f"{v:.1f} ms"


def _tokens(v: Any) -> str:
    return "" if _missing(v) else f"{v:,.0f}"


def _mib(v: Any) -> str:
    return "" if _missing(v) else f"{v / 2**20:,.1f} MiB"


_ROWS = (
    ("cold TTFT (nothing cached)", "cold_ttft_s", _s),
    ("warm TTFT (context cached, new question)", "warm_ttft_s", _s),
    ("prompt tokens reused when warm", "warm_cached_tokens", _tokens),
    ("decode at that context, per token", "decode_ms_per_token", _ms),
    ("whole answer on a warm prompt, to its last token", "answer_s", _s),
    ("tokens in that answer", "answer_tokens", _tokens),
    ("KV bytes per cached prompt", "kv_bytes_per_cached_prompt", _mib),
    ("weights in memory", "weight_bytes", _mib),
)


def _batched(system: dict[str, Any]) -> str:
    rows = system.get("batched_decode")
    if not rows:
        return ""
    return " / ".join(f"{v['tokens_per_s']:.1f}" for v in rows.values())


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _fidelity(f: dict[str, Any]) -> list[str]:
    p32 = f["float32"]["perplexity"]
    lines = [
        f"Fidelity against float32 on {f['prompts']} of these prompts, each candidate fed float32's greedy "
        f"answer (teacher forcing): how often its first {f['answer_tokens']} greedy tokens equal float32's, "
        "how many lead on average before the first difference, KL(float32 || candidate) of the next-token "
        f"distributions along the answers, and perplexity of {f['corpus_tokens']:,} tokens of the bundled "
        f"corpus (float32: {p32:.3f}). bfloat16 (the engine's `dtype='bfloat16'`) is there for scale: a "
        "much smaller perturbation than int8.",
        "",
        "| candidate | greedy agreement | tokens before the first difference | mean KL | max KL | perplexity |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("int8", "bfloat16"):
        c = f.get(name)
        if c:
            lines.append(
                f"| {name} | {100 * c['greedy_agreement']:.0f}% | {c['agreed_tokens_mean']:.1f} | "
                f"{c['kl_mean']:.4f} | {c['kl_max']:.3f} | {c['perplexity']:.3f} ({100 * (c['perplexity'] / p32 - 1):+.2f}%) |"
            )
    if "bfloat16_not_run" in f:
        lines += ["", f"bfloat16: {f['bfloat16_not_run']}."]
    return lines


def _targets(sec: dict[str, Any]) -> list[str]:
    s = sec["systems"]
    f32, i8, llama = s["float32"], s["int8"], s.get("llama.cpp")
    fid = sec["fidelity"]
    rows = ["| target | measured | met |", "|---|---|---|"]

    def add(target: str, value: str, met: bool | None) -> None:
        rows.append(f"| {target} | {value} | {'' if met is None else 'yes' if met else '**no**'} |")

    dec = i8["decode_ms_per_token"]
    add("int8 decode at 1.5k context <= 20 ms/token", f"{dec:.1f} ms", dec <= 20)
    if llama:
        ratio = dec / llama["decode_ms_per_token"]
        add("... within 1.25x of llama.cpp's decode", f"{ratio:.2f}x llama.cpp's", ratio <= 1.25)
        add("... faster than llama.cpp (stretch)", f"{ratio:.2f}x llama.cpp's", ratio < 1.0)
    warm = i8["warm_ttft_s"]
    add("int8 warm TTFT <= 0.10 s", f"{warm:.3f} s", warm <= 0.10)
    if llama:
        add(
            "... below llama.cpp's warm TTFT",
            f"{warm:.3f} vs {llama['warm_ttft_s']:.3f} s",
            warm < llama["warm_ttft_s"],
        )
    cold = i8["cold_ttft_s"] / f32["cold_ttft_s"]
    add("int8 cold TTFT no worse than float32's", f"{cold:.2f}x float32's", cold <= 1.0)
    ans = i8["answer_s"]
    add(f"{sec['answer_tokens']}-token answer on a warm prompt <= 1.8 s", f"{ans:.2f} s", ans <= 1.8)
    agree = fid["int8"]["greedy_agreement"]
    add(
        f"greedy {fid['answer_tokens']}-token agreement >= 90% of prompts",
        f"{100 * agree:.0f}%",
        agree >= 0.9,
    )
    ppl = fid["int8"]["perplexity"] / fid["float32"]["perplexity"] - 1
    add("corpus perplexity within 3% of float32's", f"{100 * ppl:+.2f}%", abs(ppl) <= 0.03)
    b8 = i8.get("batched_decode", {}).get("8")
    if b8:
        f8 = f32["batched_decode"]["8"]["tokens_per_s"]
        add(
            f"batched decode at 8 requests >= 2x {BATCH_BASELINE_TOK_S} tok/s",
            f"{b8['tokens_per_s']:.1f} tok/s ({b8['tokens_per_s'] / f8:.2f}x float32's in this run)",
            b8["tokens_per_s"] >= 2 * BATCH_BASELINE_TOK_S,
        )
    return rows
