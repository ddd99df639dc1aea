"""rag.evaluation: measuring what the rag layer gives: retrieval on labelled questions (``evaluate``,
``comparison``, ``prefixrag eval-retrieval`` in ``cli``)."""
