"""rag.api: the FastAPI service (RAG endpoint, OpenAI-compatible API, documents, metrics, web page).

Example:
    >>> from rag.api import Settings, create_app
    >>> app = create_app(Settings(api_keys={"sk-alice-123": "alice"}))   # doctest: +SKIP
"""

from rag.api.app import create_app
from rag.api.settings import Settings, get_settings

__all__ = ["Settings", "create_app", "get_settings"]
