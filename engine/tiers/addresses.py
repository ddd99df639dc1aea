"""Content addresses of disk KV blocks: a model fingerprint and a hash chain over 64-token blocks.

A block's address is ``sha256(parent address, its token ids)``, and the chain starts from
``sha256(model fingerprint, namespace)``; the record after a parent whose block starts with a given
token (a prefix's partial last block, or a link to the latest whole block written there) is named by
its parent and that first token (``tail_hash``). So an address names the whole prefix up to the block's end,
for one model, dtype, KV format and weights format, in one tenant namespace: another model or tenant
can never compute it, and two processes that compute the same KV compute the same address.

Example:
    >>> root = chain_root("f" * 64, "smollm2\\x1ftenant-a")
    >>> keys = block_hashes(root, list(range(130)))      # two whole blocks; the last 2 tokens are not one
    >>> len(keys), keys[0] != block_hashes(chain_root("f" * 64, "smollm2\\x1ftenant-b"), list(range(64)))[0]
    (2, True)
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from typing import Any

import torch

from engine.kv.state import BLOCK_TOKENS
from engine.tiers.blockformat import BlockMeta

CHAIN_VERSION = b"prefixrag-kv-chain-v1"
_SAMPLES_PER_TENSOR = 1024  # elements of each weight that enter the fingerprint


def model_fingerprint(
    model: Any, *, model_id: str, dtype: str, kv_dtype: str, weights: str, kernels: str = ""
) -> str:
    """What KV depends on, as a hex digest: the model id, its config, a strided sample of every weight
    and buffer, the compute dtype, the KV storage format, the weights format and ``kernels`` (what
    computes the KV's bits: engine.exact_reuse.kernel_signature), so KV from another CPU, library or
    kernel build is a miss, never a silently inexact hit.

    The weight sample is read in milliseconds; any fine-tune or re-quantization changes it, and two
    processes that load the same files compute the same digest.
    """
    digest = hashlib.sha256()
    described = {
        "model_id": model_id,
        "config": _config_dict(model.config),
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "weights": weights,
        "kernels": kernels,
        "block_tokens": BLOCK_TOKENS,
    }
    digest.update(json.dumps(described, sort_keys=True, default=str).encode())
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(_sample_bytes(tensor))
    return digest.hexdigest()


def _config_dict(config: Any) -> dict[str, Any]:
    """The config's fields, without the ones that name where or by what it was saved."""
    raw = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    skip = {"transformers_version", "torch_dtype", "dtype"}
    return {k: v for k, v in raw.items() if not k.startswith("_") and k not in skip}


def _sample_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().reshape(-1)
    step = max(1, flat.numel() // _SAMPLES_PER_TENSOR)
    sample = flat[::step][:_SAMPLES_PER_TENSOR].contiguous().cpu()
    return bytes(sample.view(torch.uint8).numpy()) if sample.numel() else b""


def chain_root(fingerprint: str, namespace: str) -> bytes:
    """The parent digest of a namespace's first block."""
    return hashlib.sha256(CHAIN_VERSION + b"\0" + fingerprint.encode() + b"\0" + namespace.encode()).digest()


def block_hashes(root: bytes, tokens: Sequence[int], block_tokens: int = BLOCK_TOKENS) -> list[str]:
    """Hex addresses of every whole block of ``tokens`` (a trailing partial block has none)."""
    out: list[str] = []
    parent = root
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        parent = block_address(parent, tokens[start : start + block_tokens])
        out.append(parent.hex())
    return out


def block_address(parent: bytes, block: Sequence[int]) -> bytes:
    """The address of the block holding ``block`` after ``parent`` (the previous address or the root)."""
    return hashlib.sha256(parent + struct.pack(f"<{len(block)}q", *block)).digest()


def tail_hash(parent: bytes, first_token: int) -> str:
    """Hex address of the record after ``parent`` for blocks starting with ``first_token``: a prefix's
    last, partial block, or a link to the latest whole block written there. Named by the whole blocks
    before it and one token only, so a reader whose prompt continues differently still finds it (and
    uses the tokens both share); the latest writer of another continuation replaces it."""
    return hashlib.sha256(parent + b"\0tail\0" + struct.pack("<q", first_token)).hexdigest()


class PrefixAddresses:
    """The addresses and expected headers of one tier's records, for one model fingerprint and KV
    format (chain roots are computed once per namespace).

    Example:
        >>> addr = PrefixAddresses("f" * 64, "float32")
        >>> chain = block_hashes(addr.root("m\\x1ft"), list(range(128)))
        >>> addr.parent(chain, "m\\x1ft", 64).hex() == chain[0]
        True
    """

    def __init__(self, fingerprint: str, kv_dtype: str) -> None:
        self.fingerprint = fingerprint
        self.kv_dtype = kv_dtype
        self._roots: dict[str, bytes] = {}

    def root(self, namespace: str) -> bytes:
        root = self._roots.get(namespace)
        if root is None:
            root = self._roots[namespace] = chain_root(self.fingerprint, namespace)
        return root

    def parent(self, chain: Sequence[str], namespace: str, pos: int) -> bytes:
        """The address before position ``pos`` (a block boundary): the previous block's, or the root."""
        j = pos // BLOCK_TOKENS
        return bytes.fromhex(chain[j - 1]) if j else self.root(namespace)

    def meta(
        self, chain: Sequence[str], namespace: str, pos: int, key: str, tokens: Sequence[int] | None
    ) -> BlockMeta:
        """What the record ``key`` after block boundary ``pos`` must claim (``tokens`` None: any)."""
        parent = self.parent(chain, namespace, pos).hex()
        return BlockMeta(
            key, parent, self.fingerprint, self.kv_dtype, None if tokens is None else list(tokens)
        )
