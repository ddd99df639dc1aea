"""engine.kv: KV storage in RAM: the cache's segments and a request's buffer (``state``), the storage
formats (``codec``), the slabs the cache's blocks live in (``block_pool``) and recycled request buffers
(``buffer_pool``).

Modules inside ``engine`` import from the defining module; this package re-exports what callers
outside it use most.
"""

from engine.kv.block_pool import KVBlockPool
from engine.kv.buffer_pool import BufferPool
from engine.kv.codec import KV_DTYPES, KVCodec, KVDType, KVGeometry, compute_dtype, make_codec
from engine.kv.state import BLOCK_TOKENS, KVBuffer, KVSegment

__all__ = [
    "BLOCK_TOKENS",
    "KV_DTYPES",
    "BufferPool",
    "KVBlockPool",
    "KVBuffer",
    "KVCodec",
    "KVDType",
    "KVGeometry",
    "KVSegment",
    "compute_dtype",
    "make_codec",
]
