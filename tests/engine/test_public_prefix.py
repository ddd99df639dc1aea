"""The public namespace: leading prompt tokens vouched public are shared across tenants, nothing after
them ever is, and reusing them changes no output."""

import pytest

from engine import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
PUBLIC = (
    "Reference passage. The Harwick ferry leaves at 7:40 every morning; its captain is Noor Adeyemi, "
    "tickets cost 12 euros and the crossing takes 50 minutes. "
) * 3


@pytest.fixture(scope="module")
def public_ids(engine):
    return engine.encode(PUBLIC)


def _prompt(engine, public_ids, question: str) -> list[int]:
    return public_ids + engine.encode(f"Question: {question}\nAnswer:")


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_the_public_part_is_shared_and_the_private_part_is_not(engine, engine_nocache, public_ids):
    n = len(public_ids)
    alice = _prompt(engine, public_ids, "When does the ferry leave?")
    bob = _prompt(engine, public_ids, "Who is the captain?")
    first = engine.generate(alice, GREEDY, namespace="pp-alice", public_prefix=n)
    assert first.cached_tokens == 0
    shared = engine.generate(bob, GREEDY, namespace="pp-bob", public_prefix=n)
    assert shared.cached_tokens == n  # the public part, from alice's request
    assert shared.token_ids == engine_nocache.generate(bob, GREEDY).token_ids  # reuse changes nothing
    again = engine.generate(alice, GREEDY, namespace="pp-bob", public_prefix=n)
    # alice's question never reached the public namespace: bob reuses no more than his own request
    # shares with hers (the public part and the "Question:" tokens)
    assert again.cached_tokens == _common(alice, bob) < len(alice) - 1
    assert again.token_ids == first.token_ids
    own = engine.generate(alice, GREEDY, namespace="pp-bob", public_prefix=n)
    assert own.cached_tokens == len(alice)  # bob's own namespace holds his whole request, logits too


def test_without_a_public_prefix_nothing_is_shared(engine, public_ids):
    prompt = _prompt(engine, public_ids, "How much is a ticket?")
    engine.generate(prompt, GREEDY, namespace="np-alice", public_prefix=len(public_ids))
    assert engine.generate(prompt, GREEDY, namespace="np-carol").cached_tokens == 0
    assert engine.cached_prefix_length(prompt, public=True) == len(public_ids)
    assert engine.cached_prefix_length(prompt, "np-dave") == 0


def test_public_prefix_is_validated_and_capped(engine, public_ids):
    prompt = _prompt(engine, public_ids, "How long is the crossing?")
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match="public_prefix"):
            engine.generate(prompt, GREEDY, namespace="cap", public_prefix=bad)  # type: ignore[arg-type]
    r = engine.generate(prompt, GREEDY, namespace="cap-a", public_prefix=10 * len(prompt))
    assert r.cached_tokens <= len(prompt) - 1  # at least one prompt token is always computed
