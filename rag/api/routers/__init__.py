"""One APIRouter per file; rag.api.app includes them."""
