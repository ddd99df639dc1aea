"""The native kernels (the decode step, the prefill's row operations), compiled once per machine with
its own C++ compiler and kept.

``engine/native/*.cpp`` are compiled by torch's extension builder (g++ and ninja) into
``engine/native/compiled/<key>/`` beside the source (``$PREFIXRAG_HOME/native/<key>/`` where the
package folder is read-only), the key naming the sources' hash and the torch version, so a changed
source or another torch builds anew and every later process, whatever its ``$PREFIXRAG_HOME``,
imports the library without compiling. A file lock makes concurrent first uses (a server's
replicas, test workers) build once. ``make setup`` builds it (:func:`main`); a machine without a
compiler gets a clear reason (the fused runner then runs the Python layer loop and says why).

Example:
    >>> module = native_module()   # doctest: +SKIP
    >>> module.DecodeModel         # doctest: +SKIP
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

from engine.paths import prefixrag_home

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "module.cpp",
        "decode_step.cpp",
        "decode_step_f32.cpp",
        "prefill_rows.cpp",
        "prefill_rows_f32.cpp",
        "prefill_attention.cpp",
        "prefill_attention_amx.cpp",
        "linear_tiles.cpp",
        "linear_amx.cpp",
        "linear_tiles_f32.cpp",
        "prefill_attention_f32.cpp",
        "linear_int8.cpp",
        "sample.cpp",
        "key_rotation.cpp",
    )
)
FOLDER = Path(__file__).parent
HEADERS = tuple(sorted(FOLDER.glob("*.h")))
CFLAGS = [
    "-O3",
    "-fno-math-errno",
    "-fopenmp",
]  # -fopenmp: at::parallel_for splits rows across torch's threads


class NativeBuildError(RuntimeError):
    """The native kernels could not be compiled or loaded here (the message says why)."""


def build_key() -> str:
    """What the compiled library depends on: the source and the torch it links against."""
    code = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    digest = hashlib.sha256(code + " ".join(CFLAGS).encode()).hexdigest()[:12]
    return f"{digest}-torch{torch.__version__.replace('+', '_')}"


def module_name() -> str:
    return "prefixrag_decode_" + build_key().split("-")[0]


@functools.cache
def native_module() -> ModuleType:
    """The compiled extension, built on first use on this machine (raises NativeBuildError)."""
    folders = [FOLDER / "compiled" / build_key(), prefixrag_home() / "native" / build_key()]
    for folder in folders:
        if (folder / f"{module_name()}.so").exists():
            return _import(folder / f"{module_name()}.so")
    folder = folders[0] if os.access(FOLDER, os.W_OK) else folders[1]
    _build(folder)
    return _import(folder / f"{module_name()}.so")


def _build(folder: Path) -> None:
    # the ninja that pip installs beside this interpreter (a dependency) counts, activated or not
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    missing = [tool for tool in ("g++", "ninja") if shutil.which(tool) is None]
    if missing:
        raise NativeBuildError(f"cannot compile the native decode step: {', '.join(missing)} not found")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder; the others find the library when it is done
        if (folder / f"{module_name()}.so").exists():
            return
        from torch.utils.cpp_extension import load

        try:
            load(
                module_name(),
                [str(path) for path in SOURCES],
                extra_cflags=CFLAGS,
                build_directory=str(folder),
                verbose=False,
            )
        except (RuntimeError, OSError) as exc:
            raise NativeBuildError(f"compiling the native kernels failed: {exc}") from exc


def _import(library: Path) -> ModuleType:
    name = module_name()
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.ExtensionFileLoader(name, str(library))
    spec = importlib.util.spec_from_file_location(name, library, loader=loader)
    if spec is None:
        raise NativeBuildError(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    try:
        loader.exec_module(module)
    except ImportError as exc:
        raise NativeBuildError(f"loading {library} failed: {exc}") from exc
    sys.modules[name] = module
    return module


def main() -> None:
    """``make setup``: build now, so the first engine does not wait for g++ (a failure is a line)."""
    try:
        print(f"native decode step: {native_module().__file__}")
    except NativeBuildError as exc:
        print(f"native decode step not built (decode runs the layer loop): {exc}", file=sys.stderr)
