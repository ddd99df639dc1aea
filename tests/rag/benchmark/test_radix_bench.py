"""The radix benchmark: a deterministic stream, a well-formed figures dict, and the example's main()."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from rag.benchmark.radix_bench import make_stream, run_radix_bench

ROOT = Path(__file__).resolve().parents[3]


def test_stream_is_seeded_zipf_prefixes_plus_suffixes() -> None:
    a = make_stream(400, num_prefixes=8, seed=3)
    assert a == make_stream(400, num_prefixes=8, seed=3) and a != make_stream(400, num_prefixes=8, seed=4)
    assert all(516 <= len(t) <= 2256 for t in a)
    heads = Counter(tuple(t[:500]) for t in a)
    counts = [c for _, c in heads.most_common()]
    assert len(heads) <= 8 and counts[0] > 3 * counts[-1]  # popularity is skewed


def test_run_radix_bench_returns_figures() -> None:
    out = run_radix_bench(levels=(3000, 20_000), requests=60, policies=("lru", "gdsf"), page_size=2)
    assert set(out["results"]) == {"lru", "gdsf"}
    for levels in out["results"].values():
        assert set(levels) == {"3000", "20000"}
        for level, r in levels.items():
            for key in ("match_us", "insert_us", "match_insert_us", "match_insert_2000_us"):
                assert 0 < r[key]["median"] <= r[key]["p95"]
            assert 0.0 <= r["hit_rate"] <= 1.0
            assert 0 < r["cached_tokens"] <= int(level)
    assert out["config"]["page_size"] == 2
    with pytest.raises(ValueError, match="bytes_per_token"):
        run_radix_bench(bytes_per_token=6)


def test_example_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_radix_example", ROOT / "examples" / "bench_radix.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "figures.json"
    figures = module.main(["--levels", "4000", "--requests", "40", "--policy", "lru", "--json", str(out)])
    assert json.loads(out.read_text()) == figures
    assert "lru" in capsys.readouterr().out
