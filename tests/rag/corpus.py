"""A tiny corpus with one clearly right document per topic, for fast tests."""

from rag.types import Document

# A small corpus with one clearly right answer per question below.
SMALL_CORPUS = [
    Document(
        id="cats.md",
        text="# Cats\n\nCats are small domesticated felines. A cat purrs when content and sleeps most of the day.",
        metadata={"source": "cats.md"},
    ),
    Document(
        id="python-lists.txt",
        text="Python lists\n\nA list is a mutable sequence. Use append() to add an item and pop() to remove "
        "the last one. Lists can be sorted in place with list.sort().",
    ),
    Document(
        id="paris.html",
        text="Paris\n\nThe Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889.",
        metadata={"title": "Paris landmarks"},
    ),
    Document(
        id="kv-cache.md",
        text="# KV cache\n\nPrefill computes keys and values for every prompt token; a prefix KV cache lets "
        "the model reuse them for a repeated prefix, which cuts the time to first token.",
    ),
]
