"""rag.ingestion: documents, loaders, chunking, the knowledge base and its on-disk format."""
