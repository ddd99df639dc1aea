"""The engine's thread frees its OpenMP team once idle (engine.engine.TEAM_KEEP_S): a team kept there
would throttle every other thread's (a second engine's), since libgomp shortens all spins while the
process holds more workers than CPUs (engine/openmp_pool.py)."""

import threading
import time

import engine.engine as engine_module
from engine import Engine, EngineConfig, SamplingParams


def test_engine_frees_its_team_once_idle_not_while_busy(loaded_model, monkeypatch):
    calls: list[float] = []  # when the engine's thread freed its team
    busy = threading.Event()

    def recording_release() -> bool:
        name = threading.current_thread().name
        assert name != "prefixrag-engine" or not busy.is_set(), "freed its team while a request was running"
        if name == "prefixrag-engine":
            calls.append(time.monotonic())
        return True

    monkeypatch.setattr(engine_module, "release_thread_pool", recording_release)
    config = EngineConfig(model=loaded_model.model_id, disk_cache_bytes=0, idle_trim_s=None)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        busy.set()
        eng.generate("Say hi.", SamplingParams(max_tokens=3))
        busy.clear()
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) == 1
        time.sleep(20 * engine_module.TEAM_KEEP_S)
        assert len(calls) == 1  # once per idle period, not a busy loop
        busy.set()
        eng.generate("Say hi again.", SamplingParams(max_tokens=2))
        busy.clear()
        time.sleep(20 * engine_module.TEAM_KEEP_S)
        assert len(calls) == 2
    finally:
        eng.close()
