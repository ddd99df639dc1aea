"""Kernel measurements kept on disk: a later process reads the tile menus and the exact-reuse verdict
back instead of measuring again; a damaged entry is measured again, never trusted."""

from __future__ import annotations

import json

from engine import calibration_cache
from engine.row_tiles import MENU_KIND, TILE, TileMenu, cached_menu


def test_a_menu_is_measured_once_then_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXRAG_HOME", str(tmp_path))
    measured: list[int] = []

    def measure() -> TileMenu:
        measured.append(1)
        return TileMenu((TILE, 64), (1e-4, 3e-4))

    key = ("test-menu", 123, 456)
    first = calibration_cache.recall(MENU_KIND, key)
    assert first is None
    menu = cached_menu(key, measure)
    stored = calibration_cache.recall(MENU_KIND, key)
    assert stored == {"sizes": [TILE, 64], "seconds": [1e-4, 3e-4]}
    assert menu.sizes == (TILE, 64) and measured == [1]
    files = list((tmp_path / "calibration").glob("tiles-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text()) == stored


def test_a_damaged_entry_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXRAG_HOME", str(tmp_path))
    key = ("test-menu-damaged", 1)
    calibration_cache.remember("tiles", key, {"sizes": [TILE], "seconds": [1.0]})
    (path,) = (tmp_path / "calibration").glob("tiles-*.json")
    path.write_text("{not json")
    assert calibration_cache.recall("tiles", key) is None
    path.write_text(json.dumps({"sizes": [64], "seconds": [1.0]}))  # no base tile: not a menu
    menu = cached_menu(key, lambda: TileMenu((TILE,), (2.0,)))
    assert menu.sizes == (TILE,)


def test_the_key_includes_the_code_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFIXRAG_HOME", str(tmp_path))
    calibration_cache.remember("tiles", ("k",), {"sizes": [TILE], "seconds": [1.0]})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert calibration_cache.recall("tiles", ("k",)) is None  # another path: measured on its own
