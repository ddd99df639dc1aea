"""The engine's statement of its exactness: whether reusing cached KV is bit-exact on this machine.

The prefill shapes (engine.prefill_shapes, engine.row_tiles) make a token's result independent of how
its prompt was split, by construction from measured kernel behaviour. This self-check verifies the
whole on the loaded model: one seeded prompt computed in one call, then again in pieces cut at a few
points (a one-token first piece loaded from a copy, as the prefix cache hands it out; a piece across
the first 512-key block; a one-token last piece), must give the same logits and the same KV at every
layer, bit for bit. Where it holds, the engine states ``exact: true``; where it does
not, reuse stays on (its error is float rounding, as in vLLM and SGLang) and the engine says ``false``
with the first difference it found. Verdicts are kept per process for each runner configuration.

Example:
    >>> verdict = check_exact_reuse(runner)                  # doctest: +SKIP
    >>> verdict.exact, verdict.reason                        # doctest: +SKIP
    (True, 'a 530-token prompt cut at 1, 37, 520 and 529 gives the same logits and K/V bits ...')
"""

from __future__ import annotations

import itertools
import json
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.calibration_cache import machine_signature, recall, remember
from engine.isa import path_key
from engine.tiers.addresses import model_fingerprint

PROMPT_TOKENS = 530  # past one 512-key block, through several tile sizes
CUTS = (1, 37, 520, 529)  # a one-token first piece, pieces of several tile plans, a one-token last piece

_verdicts: weakref.WeakKeyDictionary[Any, dict[tuple[object, ...], ExactReuse]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


@dataclass(frozen=True)
class ExactReuse:
    """Whether reused KV gives the same bits as computing it (None: not checked, or nothing is reused).

    Example:
        >>> ExactReuse(True, "checked").to_dict()
        {'exact_reuse': True, 'exact_reuse_reason': 'checked'}
    """

    exact: bool | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"exact_reuse": self.exact, "exact_reuse_reason": self.reason}


def check_exact_reuse(runner: Any) -> ExactReuse:
    """The verdict for ``runner`` on this machine, measured on first use for its configuration."""
    key = _configuration(runner)
    with _lock:
        known = _verdicts.setdefault(runner.model, {})
        if key not in known:
            known[key] = _stored_or_checked(runner, key)
        return known[key]


def _stored_or_checked(runner: Any, key: tuple[object, ...]) -> ExactReuse:
    """The verdict another process on this machine reached for the same weights, else measured."""
    weights = model_fingerprint(runner.model, model_id="", dtype=str(runner.dtype), kv_dtype="", weights="")
    stored = recall("exact_reuse", (*key, weights))
    if stored is not None and isinstance(stored.get("exact"), bool) and isinstance(stored.get("reason"), str):
        return ExactReuse(stored["exact"], stored["reason"])
    verdict = _check(runner)
    remember("exact_reuse", (*key, weights), {"exact": verdict.exact, "reason": verdict.reason})
    return verdict


def kernel_signature(runner: Any) -> str:
    """What decides the bits of the KV ``runner`` computes besides the model and its formats: the
    runner's configuration (tile menus, native row kernels, threads, ISA variables), the CPU and
    torch. Processes that agree on it compute the same KV for the same tokens."""
    return json.dumps([_configuration(runner), machine_signature()], default=str)


def _configuration(runner: Any) -> tuple[object, ...]:
    codec = getattr(runner, "kv_codec", None)
    menus = getattr(runner, "menus", {})  # the tile menus the runner computes with
    tiles = tuple(sorted((shape, menu.sizes) for shape, menu in menus.items()))
    attention = getattr(getattr(runner, "attention_tiles", None), "sizes", None)
    return (
        type(runner).__name__,
        str(runner.dtype),
        getattr(runner, "weights", "float32"),
        getattr(codec, "name", None),
        getattr(runner, "row_kernels", None),
        getattr(runner, "attention_kernel", None),
        getattr(runner, "linear_kernel", None),
        tiles,
        attention,
        *path_key(),
    )


@torch.inference_mode()
def _check(runner: Any) -> ExactReuse:
    tokens = min(PROMPT_TOKENS, runner.max_context - 1)
    cuts = tuple(c for c in CUTS if 0 < c < tokens)
    gen = torch.Generator().manual_seed(0)
    low = min(100, runner.vocab_size // 2)  # past the special tokens of a real vocabulary
    ids = torch.randint(low, min(runner.vocab_size, 30_000), (tokens,), generator=gen).tolist()
    whole = runner.new_buffer(tokens)
    reference = runner.prefill(ids, whole)
    logits, split = _split_run(runner, ids, cuts)
    where = ", ".join(str(c) for c in cuts)
    if not torch.equal(logits, reference):
        diff = float((logits.float() - reference.float()).abs().max())
        return ExactReuse(False, f"cut at {where}: logits differ by up to {diff:.3g} ({_what(runner)})")
    a, b = whole.segment(0, tokens), split.segment(0, tokens)
    if not (torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)):
        return ExactReuse(False, f"cut at {where}: cached K/V differ ({_what(runner)})")
    return ExactReuse(
        True,
        f"a {tokens}-token prompt cut at {where} gives the same logits and K/V bits as computed whole "
        f"({_what(runner)})",
    )


def _split_run(runner: Any, ids: Sequence[int], cuts: Sequence[int]) -> tuple[torch.Tensor, Any]:
    """Prefill ``ids`` in pieces ending at ``cuts``; the first piece's KV arrives as a copied segment."""
    first = runner.new_buffer(cuts[0])
    runner.prefill(ids[: cuts[0]], first)
    buffer = runner.new_buffer(len(ids))
    buffer.load_prefix([first.segment(0, cuts[0])])
    bounds = [*cuts, len(ids)]
    logits = None
    for start, end in itertools.pairwise(bounds):
        logits = runner.prefill(ids[start:end], buffer)
    assert logits is not None
    return logits, buffer


def _what(runner: Any) -> str:
    threads = torch.get_num_threads()
    weights = getattr(runner, "weights", "float32")
    return f"{type(runner).__name__}, {str(runner.dtype).removeprefix('torch.')}, weights {weights}, {threads} threads"


def survey(model: str | None = None) -> dict[str, Any]:
    """The verdicts on this process's code path for the bundled (or given) model: the fused runner in
    float32, bfloat16 and with int8 weights, the transformers runner, and what each computes with."""
    from engine.fused import FusedLlamaRunner
    from engine.isa import cpu_model
    from engine.models import DEFAULT_MODEL, load_model
    from engine.quant.linear import int8_backend, int8_supported
    from engine.runner import ModelRunner

    out: dict[str, Any] = {
        "cpu": cpu_model(),
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "int8_backend": int8_backend(),
        "runners": {},
    }
    for dtype in ("float32", "bfloat16"):
        loaded = load_model(model or DEFAULT_MODEL, dtype=dtype)
        runners: dict[str, Any] = {f"fused {dtype}": FusedLlamaRunner(loaded.model)}
        if dtype == "float32":
            runners["transformers float32"] = ModelRunner(loaded.model)
            if int8_supported() is None:
                runners["fused int8 weights"] = FusedLlamaRunner(
                    loaded.model, weights="int8", tokenizer=loaded.tokenizer
                )
        for name, runner in runners.items():
            verdict = check_exact_reuse(runner)
            menus = {f"{o}x{i}": list(m.sizes) for (o, i), m in getattr(runner, "menus", {}).items()}
            attention = getattr(getattr(runner, "attention_tiles", None), "sizes", None)
            out["runners"][name] = {
                **verdict.to_dict(),
                "linear_tiles": menus,
                "linear_kernel": getattr(runner, "linear_kernel", None),
                "attention_tiles": list(attention) if attention else None,
            }
    return out


if __name__ == "__main__":  # python -m engine.exact_reuse: this code path's verdicts as JSON
    import json

    print(json.dumps(survey()))
