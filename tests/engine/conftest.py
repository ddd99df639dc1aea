import pytest

from engine import Engine, EngineConfig


@pytest.fixture(scope="module")
def engine(loaded_model):
    """The bundled model behind a 1 GiB prefix cache (fused runner)."""
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def engine_nocache(loaded_model):
    """The same model with caching off: the reference for every reuse check."""
    config = EngineConfig(model=loaded_model.model_id, enable_prefix_cache=False)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id=loaded_model.model_id, config=config)
    yield eng
    eng.close()
