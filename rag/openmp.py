"""How `prefixrag serve`'s OpenMP threads wait between parallel regions, set before torch loads.

libgomp (torch's OpenMP runtime) reads ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` once, when torch
first loads it, and ``import rag`` loads torch: so this module is the first thing ``rag`` imports, and
it imports nothing but the standard library. A server's threads spin for ``SERVE_SPINCOUNT`` turns
(about 0.3 ms) after a region, then sleep: long enough to catch a forward pass's next region (waking a
sleeping thread costs ~65 us, and a prefill runs about 400 regions), short enough that a spinning
thread does not hold a core that the decode step's own threads or the event loop need. libgomp's
default spin (300,000 turns, about 5 ms) made every per-token torch operation (an int8 step's
rescoring, say) leave a thread spinning against the decode step's. Figures:
docs/benchmarks/native/README.md. A caller's own ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` wins.

Example:
    >>> is_serve_command(["/venv/bin/python", "/venv/bin/prefixrag", "serve", "--port", "8000"])
    True
    >>> is_serve_command(["python", "-m", "rag.cli", "demo"])
    False
    >>> env = {}; apply_serve_defaults(env, ["python", "-m", "rag.cli", "serve"]); env
    {'GOMP_SPINCOUNT': '10000'}
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence

SERVE_SPINCOUNT = "10000"
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
_CLI_MODULES = ("rag.cli", "rag")  # `python -m rag.cli serve`


def is_serve_command(argv: Sequence[str]) -> bool:
    """Whether the interpreter's command line (``sys.orig_argv``) runs ``prefixrag serve``."""
    args = list(argv[1:])
    if len(args) >= 3 and args[0] == "-m" and args[1] in _CLI_MODULES:
        return args[2] == "serve"
    scripts = [i for i, a in enumerate(args) if os.path.basename(a) == "prefixrag"]
    return bool(scripts) and args[scripts[0] + 1 : scripts[0] + 2] == ["serve"]


def apply_serve_defaults(
    environ: MutableMapping[str, str] = os.environ, argv: Sequence[str] | None = None
) -> None:
    """Give a ``prefixrag serve`` process the bounded spin, unless its caller set a wait already."""
    command = sys.orig_argv if argv is None else argv
    if is_serve_command(command) and not any(name in environ for name in WAIT_VARIABLES):
        environ["GOMP_SPINCOUNT"] = SERVE_SPINCOUNT


def wait_settings(environ: MutableMapping[str, str] = os.environ) -> dict[str, str | None]:
    """The wait variables this process's OpenMP runtime was started with (as ``/server_info`` reports)."""
    return {name.lower(): environ.get(name) for name in WAIT_VARIABLES}


apply_serve_defaults()
