"""engine: the only layer that runs model forward passes (torch / transformers)."""

from engine.models import DEFAULT_MODEL, LoadedModel, load_model, load_tokenizer, prefixrag_home

__all__ = ["DEFAULT_MODEL", "LoadedModel", "load_model", "load_tokenizer", "prefixrag_home"]
