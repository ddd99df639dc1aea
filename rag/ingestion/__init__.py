"""rag.ingestion: loaders and chunking (where documents are kept: ``rag.stores``)."""
