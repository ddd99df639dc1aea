"""rag.benchmark: benchmarks that replay a RAG workload through the stack (``router``: replicas behind
sglang-router)."""
