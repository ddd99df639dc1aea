"""Quantize once: a model's int8 tensors cached under ``$PREFIXRAG_HOME/quantized/``.

The file (safetensors, no pickle) is keyed by the recipe that made it and by the source model
directory with the size and modification time of its weight files, so a changed model or recipe is
converted again. It is written atomically (temp file, then ``os.replace``). A file that lacks a tensor
the model needs, holds one of another shape or dtype, or does not parse is rebuilt, never trusted.

Example:
    >>> spec = {"lm_head.q": (torch.int8, (49152, 576)), "lm_head.scale": (torch.float32, (49152,))}
    >>> tensors = load_or_build(cache_path_for("/models/m", "int8-v2"), spec, convert)  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from engine.paths import prefixrag_home

log = logging.getLogger(__name__)

Spec = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]  # tensor name -> (dtype, shape)


def cache_path_for(model_dir: str | os.PathLike[str] | None, recipe: str) -> Path | None:
    """Where a local model's converted tensors are cached (None: not a local directory, convert at
    every load). ``recipe`` names everything that shapes the result besides the model."""
    if model_dir is None or not Path(model_dir).is_dir():
        return None
    source = Path(model_dir).resolve()
    identity = [recipe, str(source)]
    for f in sorted(source.glob("*.safetensors")) + sorted(source.glob("*.bin")):
        st = f.stat()
        identity.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    return prefixrag_home() / "quantized" / f"{source.name}-{digest}.safetensors"


def load_or_build(
    path: Path | None, spec: Spec, build: Callable[[], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """The tensors ``spec`` names: read from ``path`` when it holds exactly them, else built and saved."""
    if path is not None:
        stored = _read(path, spec)
        if stored is not None:
            return stored
    tensors = build()
    problem = _mismatch(tensors, spec)
    if problem:
        raise AssertionError(f"conversion produced {problem}")
    if path is not None:
        _write(path, tensors)
    return tensors


def _mismatch(tensors: Mapping[str, torch.Tensor], spec: Spec) -> str | None:
    if set(tensors) != set(spec):
        missing, extra = sorted(set(spec) - set(tensors)), sorted(set(tensors) - set(spec))
        return f"the wrong tensors (missing {missing[:3]}, unexpected {extra[:3]})"
    for name, (dtype, shape) in spec.items():
        t = tensors[name]
        if t.dtype != dtype or tuple(t.shape) != shape:
            return f"{name}: {t.dtype} {tuple(t.shape)}, expected {dtype} {shape}"
    return None


def _read(path: Path, spec: Spec) -> dict[str, torch.Tensor] | None:
    """The stored tensors, or None (with a log line) when the file is absent or unusable."""
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
        problem = _mismatch(tensors, spec)
        if problem:
            raise ValueError(problem)
    except Exception as exc:  # a damaged or foreign file is a miss: convert again
        log.warning("quantized weights %s are unusable (%s); rebuilding them", path, exc)
        return None
    return tensors


def _write(path: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp)
        os.chmod(tmp, 0o644)  # like the converted model next to it (mkstemp makes it private)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("cached quantized weights at %s", path)
