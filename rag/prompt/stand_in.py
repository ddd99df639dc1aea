"""The stand-in passage a reused chunk's KV is computed after, in ``chunks`` reuse mode.

A chunk that is not first in a prompt follows other passages; its KV, computed once and reused
wherever the chunk stands, is closest to the KV it would get in place when it is computed after a
passage too, rather than right after the system prompt (where its first tokens become an attention
sink they never are in place). So a chunk's canonical placement is ``stable prefix, [1], this
passage, [2], chunk`` (``PromptAssembler.stitch_placement``). The passage says nothing a question
could be answered from, so that no chunk's KV carries a fact of its own.

Example:
    >>> STAND_IN_SOURCE, STAND_IN_TEXT[:16]
    ('reference', 'Reference notes.')
"""

from __future__ import annotations

STAND_IN_SOURCE = "reference"
STAND_IN_TEXT = (
    "Reference notes. This passage gives general background: how the material is organised, which "
    "terms it uses and where its details are documented. Each section opens with a short summary, "
    "followed by definitions, examples and exceptions. Names, dates, amounts and codes are written "
    "exactly as they appear in the original records, and later passages may repeat, extend or "
    "correct them; where two passages disagree, the more specific one applies. The notes cover "
    "procedures, settings and options, people and places, products and their parts, and the history "
    "of changes, each in its own numbered passage. A reader looks up the passage that matches the "
    "question, quotes it directly rather than paraphrasing it, and cites its number. Passages are "
    "kept short so that each one can be read on its own, without the ones around it."
)
