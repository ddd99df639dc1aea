"""The usage examples in prefix_cache's docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import prefix_cache

MODULES = [prefix_cache.__name__] + [
    f"{prefix_cache.__name__}.{m.name}" for m in pkgutil.iter_modules(prefix_cache.__path__)
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_package_imports_neither_torch_nor_numpy() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(prefix_cache.__file__).resolve().parents[1]
    code = "import sys, prefix_cache; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"
