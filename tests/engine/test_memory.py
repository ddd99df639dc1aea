"""The engine hands freed heap back to the OS when it goes idle (engine.memory.trim_heap)."""

import threading
import time

import engine.engine as engine_module
from engine import Engine, EngineConfig, SamplingParams
from engine.memory import trim_heap


def test_trim_heap_reports_a_bool():
    assert trim_heap() in (True, False)


def test_engine_trims_once_after_going_idle_not_while_busy(loaded_model, monkeypatch):
    calls: list[float] = []
    busy = threading.Event()

    def counting_trim() -> bool:
        assert not busy.is_set(), "trimmed while a request was running"
        calls.append(time.monotonic())
        return False

    monkeypatch.setattr(engine_module, "trim_heap", counting_trim)
    config = EngineConfig(model=loaded_model.model_id, idle_trim_s=0.5)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        time.sleep(0.8)
        assert calls == []  # nothing served yet: nothing to trim
        busy.set()
        eng.generate("Say hi.", SamplingParams(max_tokens=3))
        busy.clear()
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(calls) == 1
        time.sleep(1.0)
        assert len(calls) == 1  # once per idle period, not a busy loop
    finally:
        eng.close()


def test_no_trim_when_idle_trim_is_off(loaded_model, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(engine_module, "trim_heap", lambda: bool(calls.append(1)))
    config = EngineConfig(model=loaded_model.model_id, idle_trim_s=None)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    try:
        eng.generate("Say hi.", SamplingParams(max_tokens=2))
        time.sleep(0.5)
        assert calls == []
    finally:
        eng.close()
