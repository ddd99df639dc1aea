"""CircuitBreaker: open on a failure, skip requests, probe only from background work after the
cooldown (which doubles while probes fail), close on a success; one log line each way."""

from __future__ import annotations

import logging

from engine.tiers.breaker import CircuitBreaker


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_open_skip_probe_and_close(caplog):
    clock = _Clock()
    breaker = CircuitBreaker(
        "store", logging.getLogger("t.breaker"), cooldown_s=1.0, max_cooldown_s=4.0, clock=clock
    )
    assert breaker.allow() and breaker.available
    with caplog.at_level(logging.WARNING, logger="t.breaker"):
        breaker.failed(TimeoutError("slow"))
        assert not breaker.available and breaker.opens == 1
        assert not breaker.allow() and not breaker.allow(probe=True)  # cooling down
        clock.now += 1.0
        assert not breaker.allow()  # requests never probe
        assert breaker.allow(probe=True) and not breaker.allow(probe=True)  # one probe at a time
        breaker.failed(ConnectionError("refused"))  # the probe failed: twice the cooldown
        clock.now += 1.5
        assert not breaker.allow(probe=True)
        clock.now += 0.5
        assert breaker.allow(probe=True)
        breaker.failed(ConnectionError("refused"))
        breaker.failed(ConnectionError("refused"))  # a call that was already out: no longer cooldown
        clock.now += 4.0
        assert breaker.allow(probe=True)  # capped at 4 s
        breaker.succeeded()
    assert breaker.available and breaker.allow() and breaker.opens == 1
    messages = [r.message for r in caplog.records]
    assert (
        len(messages) == 2
        and "unreachable (slow)" in messages[0]
        and "answers again after 7.0 s" in messages[1]
    )
    breaker.failed(TimeoutError("again"))
    assert breaker.opens == 2 and not breaker.allow()
