"""The public part of a prompt: how far it holds only operator material (system prompt, tools, pinned
context) and chunks of public collections, so its KV may be shared across tenants when that is on.

The prefix ends at the first segment that is neither: a chunk of any other collection, or the
question. The question is always the caller's own, so a prompt is never public to its end.

Example:
    >>> public_prefix_length(prompt, {"shared"})   # doctest: +SKIP
    412
"""

from __future__ import annotations

from collections.abc import Collection

from rag.prompt.assembler import CHUNK_SEGMENT, Prompt


def public_prefix_length(prompt: Prompt, public_collections: Collection[str]) -> int:
    """Tokens at the start of ``prompt`` made only of stable segments and chunks whose collection is
    in ``public_collections``."""
    collection_of = {chunk.chunk_id: getattr(chunk, "collection", None) for chunk in prompt.chunks}
    end = 0
    for segment in prompt.segments:
        if segment.name.startswith(CHUNK_SEGMENT):
            if collection_of.get(segment.name[len(CHUNK_SEGMENT) :]) not in public_collections:
                break
        elif not segment.stable:
            break
        end = segment.end
    return end
