import pytest

from engine.detokenizer import Detokenizer


@pytest.fixture(scope="module")
def tokenizer(loaded_model):
    return loaded_model.tokenizer


def _feed(detok, ids):
    return "".join(detok.push(t) for t in ids) + detok.flush()


def test_deltas_concatenate_to_the_decoded_text(tokenizer):
    text = "Prefix caching saves time: naïve prefill costs O(n²) — here’s why. 🚀 Done."
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert _feed(Detokenizer(tokenizer), ids) == tokenizer.decode(ids, skip_special_tokens=True)


def test_no_delta_ends_in_a_replacement_character(tokenizer):
    ids = tokenizer.encode("emoji 🚀🚀 and 日本語のテキスト", add_special_tokens=False)
    detok = Detokenizer(tokenizer)
    deltas = [detok.push(t) for t in ids]
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_truncates_and_stops(tokenizer):
    ids = tokenizer.encode("The answer is 42.\n\nNext question please.", add_special_tokens=False)
    detok = Detokenizer(tokenizer, stop=["\n\n"])
    shown = ""
    for t in ids:
        shown += detok.push(t)
        if detok.stopped:
            break
    shown += detok.flush()
    assert detok.stopped
    assert shown == "The answer is 42."
    assert detok.text == "The answer is 42."


def test_stop_string_split_across_tokens_is_never_shown(tokenizer):
    ids = tokenizer.encode("alpha beta STOPWORD gamma", add_special_tokens=False)
    detok = Detokenizer(tokenizer, stop=["STOPWORD"])
    shown = "".join(detok.push(t) for t in ids) + detok.flush()
    assert "STOP" not in shown
    assert shown == "alpha beta "
