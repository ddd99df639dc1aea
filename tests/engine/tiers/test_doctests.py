"""The usage examples in the tier modules' docstrings run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["addresses", "blockformat", "breaker", "readers", "stats", "writer"]


@pytest.mark.parametrize("name", MODULES)
def test_examples_run(name):
    result = doctest.testmod(importlib.import_module(f"engine.tiers.{name}"), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
