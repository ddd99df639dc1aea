"""rag.retrieval: embedder, FAISS and BM25 indexes, retrievers and rerankers."""
