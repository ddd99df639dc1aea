"""int8 weights in the runner and the engine: row-independent decode, sensible answers close to
float32's, the memory they save, one packed copy per model shared by its runners, and clear errors
for what they cannot do."""

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.fused import FusedLlamaRunner
from engine.quant.linear import int8_backend
from engine.quant.model import int8_model
from tests.engine.reuse_helpers import assert_batched_equals_solo

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def runner8(loaded_model):
    return FusedLlamaRunner(loaded_model.model, weights="int8", tokenizer=loaded_model.tokenizer)


@pytest.fixture(scope="module")
def engine8(loaded_model):
    config = EngineConfig(model=loaded_model.model_id, weights="int8")
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    yield eng
    eng.close()


def _prompt(seed: int, n: int) -> list[int]:
    return torch.randint(200, 40000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_batched_decode_equals_solo_decode(runner8):
    assert_batched_equals_solo(runner8, [_prompt(i, n) for i, n in enumerate((37, 90, 5, 64))])


ANSWERS = {  # question -> a word both weights formats answer with
    "What is the capital of France?": "Paris",
    "Say hello in French.": "Bonjour",
    "What is the opposite of hot?": "cold",
    "How many days are in a week?": "7",
}


def test_answers_like_float32(engine8, engine):
    for question, word in ANSWERS.items():
        prompt = [{"role": "user", "content": question}]
        ours, ref = engine8.generate(prompt, GREEDY), engine.generate(prompt, GREEDY)
        assert word in ours.text and word in ref.text, (question, ours.text, ref.text)
        assert ours.token_ids[0] == ref.token_ids[0]


def test_next_token_distribution_is_close_to_float32(engine8, engine):
    kls = []
    for question in ANSWERS:
        ids = engine.encode([{"role": "user", "content": question}])
        p = torch.log_softmax(engine.runner.prefill(ids, engine.runner.new_buffer(len(ids))), dim=-1)
        q = torch.log_softmax(engine8.runner.prefill(ids, engine8.runner.new_buffer(len(ids))), dim=-1)
        kls.append(float(torch.sum(p.exp() * (p - q))))
    # nats, at the first answer token; the benchmark report measures it along whole answers
    assert sum(kls) / len(kls) < 0.05 and max(kls) < 0.1, kls


def test_stats_report_the_weights_and_their_memory(engine8, engine):
    int8, fp32 = engine8.stats(), engine.stats()
    assert (int8["weights"], fp32["weights"]) == ("int8", "float32")
    # the Linears shrink to a quarter on oneDNN; fbgemm keeps the int8 matrix beside its packed copy
    # (Int8Weight.nbytes), a half; the float embedding stays
    bound = 0.75 if int8_backend() == "onednn" else 0.85
    assert int8["weight_bytes"] < bound * fp32["weight_bytes"]


def test_bad_weights_values_are_clear_errors(loaded_model):
    with pytest.raises(ValueError, match="'float32' or 'int8'"):
        EngineConfig(weights="int4")
    with pytest.raises(ValueError, match="fused runner"):
        EngineConfig(weights="int8", runner="hf")
    with pytest.raises(ValueError, match="weights must be one of"):
        FusedLlamaRunner(loaded_model.model, weights="int4")  # type: ignore[arg-type]


def test_from_pretrained_keeps_only_the_int8_copies():
    eng = Engine.from_pretrained(weights="int8", cache_bytes=1 << 26)
    try:
        layer = eng.runner.model.model.layers[0]
        assert layer.self_attn.q_proj.weight.numel() == 0 and layer.mlp.down_proj.weight.numel() == 0
        assert eng.runner.embed.numel() > 0  # the embedding (tied to the lm_head) stays float
        assert (
            "Paris"
            in eng.generate([{"role": "user", "content": "What is the capital of France?"}], GREEDY).text
        )
    finally:
        eng.close()


def test_runners_over_one_model_share_its_packed_int8_copy(loaded_model, runner8):
    copy = int8_model(loaded_model.model, loaded_model.tokenizer)
    assert int8_model(loaded_model.model, loaded_model.tokenizer) is copy
    # a second runner reads the same copy, and builds its own layers from it: the first's are untouched
    second = FusedLlamaRunner(loaded_model.model, weights="int8", tokenizer=loaded_model.tokenizer)
    assert second.layers is not runner8.layers and second.layers[0] is not runner8.layers[0]
    # where the native kernels run, the matrices' tiles are packed once too, and only read
    assert second.tiled_int8 == runner8.tiled_int8
    if runner8.tiled_int8:
        assert second.layers[0].wqkv is runner8.layers[0].wqkv and second.lm_head is runner8.lm_head
    ids = _prompt(7, 40)
    first_logits = runner8.prefill(ids, runner8.new_buffer(64))
    assert torch.equal(second.prefill(ids, second.new_buffer(64)), first_logits)
