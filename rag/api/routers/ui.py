"""The web page: GET / (a static HTML page) and its assets under /static/ (no build step)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from rag.api.errors import api_error

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
_MEDIA = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
# the files that exist when the package is imported: nothing else is ever served from here
_ASSETS = (
    {p.name: p for p in STATIC_DIR.iterdir() if p.is_file() and p.suffix in _MEDIA}
    if STATIC_DIR.is_dir()
    else {}
)

router = APIRouter(tags=["ui"], include_in_schema=False)


@router.get("/")
async def index() -> FileResponse:
    return _file("index.html")


@router.get("/static/{name}")
async def asset(name: str) -> FileResponse:
    return _file(name)


def _file(name: str) -> FileResponse:
    path = _ASSETS.get(name)
    if path is None:
        raise api_error(404, f"no such page asset: {name!r}", code="not_found")
    media = _MEDIA[path.suffix]
    return FileResponse(path, media_type=f"{media}; charset=utf-8", headers={"Cache-Control": "no-cache"})
