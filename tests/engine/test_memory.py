"""The engine hands freed heap back to the OS when it goes idle (engine.memory.trim_heap)."""

import threading
import time

import engine.engine as engine_module
from engine import Engine, SamplingParams
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
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id)
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
