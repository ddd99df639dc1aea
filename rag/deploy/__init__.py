"""rag.deploy: running several `prefixrag serve` replicas behind a router on one host."""
