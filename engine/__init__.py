"""engine: the only layer that runs model forward passes (torch / transformers)."""

from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv import KVBuffer, KVSegment
from engine.models import DEFAULT_MODEL, LoadedModel, load_model, load_tokenizer
from engine.paths import kv_cache_dir, prefixrag_home
from engine.remote import RemoteEngine
from engine.request import EngineError, GenerationResult, QueueFullError, RequestStream, StreamEvent
from engine.sampling import SamplingParams

__all__ = [
    "DEFAULT_MODEL",
    "Engine",
    "EngineConfig",
    "EngineError",
    "GenerationResult",
    "KVBuffer",
    "KVSegment",
    "LoadedModel",
    "QueueFullError",
    "RemoteEngine",
    "RequestStream",
    "SamplingParams",
    "StreamEvent",
    "kv_cache_dir",
    "load_model",
    "load_tokenizer",
    "prefixrag_home",
]
