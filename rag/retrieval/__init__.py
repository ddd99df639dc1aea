"""rag.retrieval: embedder, FAISS and BM25 indexes, retrievers, rerankers and their evaluation."""
