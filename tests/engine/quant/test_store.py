"""engine.quant.store: converted tensors are built once, read back, and rebuilt when damaged."""

import os

import pytest
import torch

from engine.quant.linear import int8_linear, pack_int8, quantize_rows
from engine.quant.store import cache_path_for, load_or_build

RECIPE = "test-recipe"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXRAG_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def matrices(loaded_model):
    """Two of the real model's matrices: layer 0's o_proj and down_proj."""
    layer = loaded_model.model.model.layers[0]
    return {"o": layer.self_attn.o_proj.weight.detach(), "down": layer.mlp.down_proj.weight.detach()}


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"weights v1")
    return d


def _spec(matrices):
    spec = {}
    for name, m in matrices.items():
        spec[f"{name}.q"] = (torch.int8, tuple(m.shape))
        spec[f"{name}.scale"] = (torch.float32, (m.shape[0],))
    return spec


def _builder(matrices, calls):
    def build():
        calls.append("build")
        out = {}
        for name, m in matrices.items():
            out[f"{name}.q"], out[f"{name}.scale"] = quantize_rows(m)
        return out

    return build


def _outputs(tensors, matrices):
    gen = torch.Generator().manual_seed(0)
    out = {}
    for name, m in matrices.items():
        w = pack_int8(tensors[f"{name}.q"], tensors[f"{name}.scale"])
        out[name] = int8_linear(torch.randn(4, m.shape[1], generator=gen), w)
    return out


def _assert_same(a, b):
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_built_once_then_read_back(home, matrices, model_dir):
    path = cache_path_for(model_dir, RECIPE)
    assert path is not None and path.is_relative_to(home)
    calls: list[str] = []
    first = load_or_build(path, _spec(matrices), _builder(matrices, calls))
    assert path.is_file() and calls == ["build"]
    stamp = path.stat().st_mtime_ns
    again = load_or_build(path, _spec(matrices), _builder(matrices, calls))
    assert calls == ["build"] and path.stat().st_mtime_ns == stamp  # read, not rebuilt
    _assert_same(_outputs(first, matrices), _outputs(again, matrices))
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


@pytest.mark.parametrize("damage", ["garbage", "truncated", "another shape", "missing tensor"])
def test_a_damaged_or_foreign_file_is_rebuilt(home, matrices, model_dir, damage):
    path = cache_path_for(model_dir, RECIPE)
    good = load_or_build(path, _spec(matrices), _builder(matrices, []))
    if damage == "garbage":
        path.write_bytes(b"\x00not a safetensors file" * 10)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:  # a file written for other tensors
        other = {"o": matrices["o"][:100]} if damage == "another shape" else {"o": matrices["o"]}
        path.unlink()
        load_or_build(path, _spec(other), _builder(other, []))
    calls: list[str] = []
    rebuilt = load_or_build(path, _spec(matrices), _builder(matrices, calls))
    assert calls == ["build"]
    _assert_same(_outputs(good, matrices), _outputs(rebuilt, matrices))
    load_or_build(path, _spec(matrices), _builder(matrices, calls))
    assert calls == ["build"]  # the rebuilt file is good again


def test_the_key_follows_the_model_files_and_the_recipe(home, model_dir, tmp_path):
    before = cache_path_for(model_dir, RECIPE)
    assert cache_path_for(model_dir, "another recipe") != before
    weights = model_dir / "model.safetensors"
    weights.write_bytes(b"weights v2, longer")
    os.utime(weights, ns=(1, 1))
    assert cache_path_for(model_dir, RECIPE) != before  # a changed model is converted again
    assert cache_path_for(tmp_path / "missing", RECIPE) is None  # not a local dir: convert at every load
    assert cache_path_for(None, RECIPE) is None


def test_without_a_path_nothing_is_written(home, matrices):
    calls: list[str] = []
    tensors = load_or_build(None, _spec(matrices), _builder(matrices, calls))
    assert set(tensors) == set(_spec(matrices)) and calls == ["build"]
    assert not home.exists()
