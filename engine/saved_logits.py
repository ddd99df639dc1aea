"""The last position's logits of recently prefilled prompts, so that a request whose whole prompt the
cache holds computes none of it.

A cached prefix normally stops one token short of the prompt: the last token is computed again for
its logits. With that prompt's logits saved when it was prefilled, the request samples its first token
from them and decodes on from the cached KV. They are the bits a recompute would give wherever reuse
is exact (the engine's ``exact_reuse`` statement), and the logits of the full prefill elsewhere.
llama.cpp's server keeps a slot's logits the same way. Only an exact prefill's logits are saved (never
a stitched prompt's), per tenant namespace, for the ``capacity`` most recent prompts (one float32 per
vocabulary entry each).
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import torch


def _key(namespace: str, token_ids: Sequence[int]) -> tuple[str, int, bytes]:
    digest = hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=32).digest()
    return namespace, len(token_ids), digest


class SavedLogits:
    """Least recently used prompts' last-position logits, keyed by tenant namespace and token ids.

    Example:
        >>> saved = SavedLogits(2)
        >>> saved.put("alice", [1, 2, 3], torch.zeros(4))
        >>> saved.get("alice", [1, 2, 3]).shape, saved.get("bob", [1, 2, 3]), saved.get("alice", [1, 2])
        (torch.Size([4]), None, None)
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, int, bytes], torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()  # the engine's thread writes; a cache reset may come from another

    def get(self, namespace: str, token_ids: Sequence[int]) -> torch.Tensor | None:
        """The saved logits of exactly this prompt in this namespace, or None."""
        if not self.capacity:
            return None
        key = _key(namespace, token_ids)
        with self._lock:
            logits = self._entries.get(key)
            if logits is not None:
                self._entries.move_to_end(key)
            return logits

    def put(self, namespace: str, token_ids: Sequence[int], logits: torch.Tensor) -> None:
        """Keep a copy of ``logits`` (``[vocab]``, of the prompt's last position)."""
        if not self.capacity:
            return
        key = _key(namespace, token_ids)
        copy = logits.detach().clone()
        with self._lock:
            self._entries[key] = copy
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(t.numel() * t.element_size() for t in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)
