"""Quantize once: a model's int8 weights cached under ``$PREFIXRAG_HOME/quantized/``.

The file holds each matrix as int8 plus its per-row float32 scales (safetensors, no pickle), keyed by
the source model directory and the size and modification time of its weight files, so a changed
model is quantized again. It is written atomically (temp file, then ``os.replace``); a file that is
missing a matrix, has a wrong shape or dtype, or does not parse is rebuilt, never trusted.

Example:
    >>> weights = load_or_quantize({"lm_head": lambda: head}, cache_path_for("/models/m"))  # doctest: +SKIP
    >>> weights["lm_head"].out_features                                                     # doctest: +SKIP
    49152
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from engine.paths import prefixrag_home
from engine.quant import Int8Weight, pack_int8, quantize_rows

log = logging.getLogger(__name__)

FORMAT = "prefixrag-int8-v1"  # bump when quantize_rows changes what it writes
MatrixSource = Callable[[], torch.Tensor]


def cache_path_for(model_dir: str | os.PathLike[str] | None) -> Path | None:
    """Where a local model's int8 weights are cached (None: not a local directory, quantize each load)."""
    if model_dir is None or not Path(model_dir).is_dir():
        return None
    source = Path(model_dir).resolve()
    identity = [FORMAT, str(source)]
    for f in sorted(source.glob("*.safetensors")) + sorted(source.glob("*.bin")):
        st = f.stat()
        identity.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    return prefixrag_home() / "quantized" / f"{source.name}-{digest}.int8.safetensors"


def load_or_quantize(sources: Mapping[str, MatrixSource], path: Path | None) -> dict[str, Int8Weight]:
    """Int8 weights for every named matrix: read from ``path`` when it is valid, else quantized from
    ``sources`` (each called once, so only one float matrix is materialised at a time) and saved."""
    if path is not None:
        stored = _read(path, sources)
        if stored is not None:
            return {name: pack_int8(q, s) for name, (q, s) in stored.items()}
    quantized = _quantize_all(sources)
    if path is not None:
        _write(path, quantized)
    return {name: pack_int8(q, s) for name, (q, s) in quantized.items()}


def _quantize_all(sources: Mapping[str, MatrixSource]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("quantizing weights to int8 (one-time)", total=len(sources))
        for name, source in sources.items():
            out[name] = quantize_rows(source())
            bar.advance(task)
    return out


def _read(
    path: Path, sources: Mapping[str, MatrixSource]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """The stored matrices, or None (with a log line) when the file is absent or unusable."""
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT or json.loads(meta.get("names", "[]")) != list(sources):
                raise ValueError("written for another model or format")
            stored = {name: (f.get_tensor(f"{name}.q"), f.get_tensor(f"{name}.scale")) for name in sources}
        for name, (q, s) in stored.items():
            if q.dtype != torch.int8 or q.dim() != 2 or s.dtype != torch.float32 or s.shape != (q.shape[0],):
                raise ValueError(f"{name}: int8 {tuple(q.shape)} / scales {tuple(s.shape)} {s.dtype}")
    except Exception as exc:  # a damaged cache file is a miss: quantize again
        log.warning("int8 weight cache %s is unusable (%s); rebuilding it", path, exc)
        return None
    return stored


def _write(path: Path, quantized: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, (q, s) in quantized.items():
        tensors[f"{name}.q"] = q.contiguous()
        tensors[f"{name}.scale"] = s.contiguous()
    meta = {"format": FORMAT, "names": json.dumps(list(quantized))}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("cached int8 weights at %s", path)
