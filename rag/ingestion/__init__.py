"""rag.ingestion: loaders, chunking, collections and the index's on-disk format."""
