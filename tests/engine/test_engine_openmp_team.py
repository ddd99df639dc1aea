"""Beside another open engine, an engine's thread frees its OpenMP team once idle
(engine.engine.TEAM_KEEP_S): a team kept there would throttle the other engine's, since libgomp
shortens all spins while the process holds more workers than CPUs (engine/openmp_pool.py). Alone, it
keeps its team (building one again costs the next request several ms)."""

import threading
import time
import weakref

import engine.engine as engine_module
from engine import Engine, EngineConfig, SamplingParams
from tests.api.helpers import wait_until


def _recording(monkeypatch, busy: threading.Event) -> list[float]:
    calls: list[float] = []  # when an engine's thread freed its team

    def recording_release() -> bool:
        if threading.current_thread().name == "prefixrag-engine":
            assert not busy.is_set(), "freed its team while a request was running"
            calls.append(time.monotonic())
        return True

    monkeypatch.setattr(engine_module, "release_thread_pool", recording_release)
    # only this test's engines count: other tests' engines may be open in this process
    monkeypatch.setattr(engine_module, "_open_engines", weakref.WeakSet())
    return calls


def _engine(loaded_model) -> Engine:
    config = EngineConfig(model=loaded_model.model_id, disk_cache_bytes=0, idle_trim_s=None)
    return Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)


def test_an_engine_beside_another_frees_its_team_once_idle_not_while_busy(loaded_model, monkeypatch):
    busy = threading.Event()
    calls = _recording(monkeypatch, busy)
    eng, other = _engine(loaded_model), _engine(loaded_model)
    try:
        busy.set()
        eng.generate("Say hi.", SamplingParams(max_tokens=3))
        busy.clear()
        assert wait_until(lambda: len(calls) == 1, timeout=5, interval=0.01)
        time.sleep(20 * engine_module.TEAM_KEEP_S)
        assert len(calls) == 1  # once per idle period, not a busy loop
        busy.set()
        eng.generate("Say hi again.", SamplingParams(max_tokens=2))
        busy.clear()
        time.sleep(20 * engine_module.TEAM_KEEP_S)
        assert len(calls) == 2
    finally:
        eng.close()
        other.close()


def test_an_engine_alone_keeps_its_team(loaded_model, monkeypatch):
    calls = _recording(monkeypatch, threading.Event())
    eng = _engine(loaded_model)
    try:
        eng.generate("Say hi.", SamplingParams(max_tokens=3))
        time.sleep(20 * engine_module.TEAM_KEEP_S)
        assert calls == []
    finally:
        eng.close()
