"""KV storage formats: how the prefix cache (RAM and disk) stores keys and values, and the rounding the
model applies so that attention always runs over exactly what is stored.

Two forms of the same KV:
  raw     the compute dtype, ``[..., head_dim]``: what a request's KVBuffer holds and attention reads
  stored  the codec's format: what the cache's blocks and the disk tier's files hold
Every K/V the model writes goes through ``round`` (= decode(encode(x))) first, on every path, a fresh
prefill included. ``encode`` is idempotent on rounded values (encode(round(x)) == encode(x), bit for
bit), so a buffer that is stored, loaded and stored again never drifts, and a prefix loaded from the
cache equals the prefix the model would have computed.

``int8`` packs each token and head as ``head_dim`` int8 codes followed by a 2-byte scale
(``[..., head_dim + 2]`` int8): symmetric, scale = absmax / 127. The scale is stored in bfloat16 for a
float32 model (a code times a bfloat16 scale is exact in float32) and rounded to a power of two for a
bfloat16 model (the only scales whose products with 7-bit codes bfloat16 holds exactly); either way
the dequantized values are exact in the compute dtype, which is what makes the rounding idempotent.

Example:
    >>> codec = make_codec("int8", torch.float32)
    >>> x = torch.randn(30, 3, 64, 64)                      # [layers, kv_heads, tokens, head_dim]
    >>> stored = codec.encode(x)
    >>> stored.shape, stored.dtype
    (torch.Size([30, 3, 64, 66]), torch.int8)
    >>> torch.equal(codec.decode(stored), codec.round(x)), torch.equal(codec.encode(codec.round(x)), stored)
    (True, True)
    >>> codec.bytes_per_token(KVGeometry(layers=30, kv_heads=3, head_dim=64))
    11880
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import torch

KVDType = Literal["float32", "bfloat16", "float16", "int8"]
KV_DTYPES: tuple[str, ...] = get_args(KVDType)

_FLOATS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SCALE_BYTES = 2
_QMAX = 127.0
_TINY = torch.finfo(torch.float32).tiny  # smallest normal scale: all-zero vectors stay finite


@dataclass(frozen=True)
class KVGeometry:
    """The shape of one token's KV in a model: layers x kv_heads x head_dim (keys) / value_dim (values)."""

    layers: int
    kv_heads: int
    head_dim: int
    value_dim: int = 0  # 0: same as head_dim

    @property
    def v_dim(self) -> int:
        return self.value_dim or self.head_dim

    @classmethod
    def from_config(cls, config: Any) -> KVGeometry:
        """From a transformers config (its text config for multimodal models)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        return cls(int(text.num_hidden_layers), int(heads), int(head_dim))

    def raw_bytes_per_token(self, element_bytes: int) -> int:
        """Bytes of one token's keys and values held unencoded at ``element_bytes`` per element."""
        return self.layers * self.kv_heads * (self.head_dim + self.v_dim) * element_bytes


class KVCodec(Protocol):
    """A KV storage format (see the module docstring)."""

    name: str
    compute_dtype: torch.dtype
    stored_dtype: torch.dtype
    identity: bool  # stored form == raw form: no rounding, encode/decode are copies

    def round(self, x: torch.Tensor) -> torch.Tensor: ...
    def encode(self, x: torch.Tensor) -> torch.Tensor: ...
    def encode_into(self, out: torch.Tensor, x: torch.Tensor) -> None: ...
    def decode(self, stored: torch.Tensor) -> torch.Tensor: ...
    def decode_into(self, out: torch.Tensor, stored: torch.Tensor) -> None: ...
    def stored_dim(self, head_dim: int) -> int: ...
    def raw_dim(self, stored_dim: int) -> int: ...
    def bytes_per_token(self, geometry: KVGeometry) -> int: ...


class _CodecBase:
    name: str
    compute_dtype: torch.dtype
    stored_dtype: torch.dtype
    identity = False

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(*x.shape[:-1], self.stored_dim(x.shape[-1]), dtype=self.stored_dtype)
        self.encode_into(out, x)
        return out

    def decode(self, stored: torch.Tensor) -> torch.Tensor:
        out = stored.new_empty(*stored.shape[:-1], self.raw_dim(stored.shape[-1]), dtype=self.compute_dtype)
        self.decode_into(out, stored)
        return out

    def encode_into(self, out: torch.Tensor, x: torch.Tensor) -> None:
        raise NotImplementedError

    def decode_into(self, out: torch.Tensor, stored: torch.Tensor) -> None:
        raise NotImplementedError

    def stored_dim(self, head_dim: int) -> int:
        return head_dim

    def raw_dim(self, stored_dim: int) -> int:
        return stored_dim

    def bytes_per_token(self, geometry: KVGeometry) -> int:
        """Stored bytes of one token's keys and values over all layers."""
        dims = self.stored_dim(geometry.head_dim) + self.stored_dim(geometry.v_dim)
        return geometry.layers * geometry.kv_heads * dims * self.stored_dtype.itemsize

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, compute={self.compute_dtype})"


class FloatCodec(_CodecBase):
    """Keys and values stored as a float dtype (a cast; the identity when it is the compute dtype)."""

    def __init__(self, stored_dtype: torch.dtype, compute_dtype: torch.dtype) -> None:
        self.name = str(stored_dtype).removeprefix("torch.")
        self.compute_dtype = compute_dtype
        self.stored_dtype = stored_dtype
        self.identity = stored_dtype == compute_dtype

    def round(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.identity else x.to(self.stored_dtype).to(x.dtype)

    def encode_into(self, out: torch.Tensor, x: torch.Tensor) -> None:
        out.copy_(x)

    def decode_into(self, out: torch.Tensor, stored: torch.Tensor) -> None:
        out.copy_(stored)


class Int8Codec(_CodecBase):
    """Symmetric int8 with one scale per token and head, packed after the codes (module docstring)."""

    name = "int8"
    stored_dtype = torch.int8

    def __init__(self, compute_dtype: torch.dtype) -> None:
        self.compute_dtype = compute_dtype
        # a code (7 bits) times the scale must be exact in the compute dtype
        self._pow2 = compute_dtype != torch.float32

    def stored_dim(self, head_dim: int) -> int:
        return head_dim + _SCALE_BYTES

    def raw_dim(self, stored_dim: int) -> int:
        return stored_dim - _SCALE_BYTES

    def _quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes as float32, scale as float32 [..., 1]) for raw ``x [..., head_dim]``."""
        xf = x.float()
        wanted = (xf.abs().amax(-1, keepdim=True) / _QMAX).clamp_(min=_TINY)
        if self._pow2:  # the smallest power of two >= wanted
            mantissa, exponent = torch.frexp(wanted)
            scale = torch.ldexp(torch.ones_like(wanted), exponent - (mantissa == 0.5).to(exponent.dtype))
        else:
            scale = wanted.to(torch.bfloat16).float()
        codes = torch.round(xf / scale).clamp_(-_QMAX, _QMAX)
        return codes, scale

    def round(self, x: torch.Tensor) -> torch.Tensor:
        codes, scale = self._quantize(x)
        return (codes * scale).to(x.dtype)

    def encode_into(self, out: torch.Tensor, x: torch.Tensor) -> None:
        codes, scale = self._quantize(x)
        d = x.shape[-1]
        out[..., :d].copy_(codes)
        out[..., d:].view(torch.bfloat16).copy_(scale)

    def decode_into(self, out: torch.Tensor, stored: torch.Tensor) -> None:
        d = self.raw_dim(stored.shape[-1])
        scale = stored[..., d:].view(torch.bfloat16).float()
        torch.mul(stored[..., :d], scale, out=out)  # computed in float32, exact, cast into out


def make_codec(kv_dtype: str, compute_dtype: torch.dtype) -> KVCodec:
    """The codec for ``kv_dtype`` on a model computing in ``compute_dtype``; ValueError for anything else.
    ``float32`` means no rounding: KV is stored in the model's own dtype."""
    if kv_dtype == "int8":
        return Int8Codec(compute_dtype)
    if kv_dtype == "float32":
        return identity_codec(compute_dtype)
    if kv_dtype in _FLOATS:
        return FloatCodec(_FLOATS[kv_dtype], compute_dtype)
    raise ValueError(f"unsupported kv_dtype {kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")


def compute_dtype(model: Any) -> torch.dtype:
    """The dtype a model computes activations (so K/V) in: its floating-point weights'."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def identity_codec(dtype: torch.dtype) -> KVCodec:
    """Store exactly what the model computes (also a segment built without a codec)."""
    return FloatCodec(dtype, dtype)
