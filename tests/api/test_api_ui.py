"""The web page's files: served, self-contained (no CDN, the machine may be offline), nothing else."""

from __future__ import annotations

import re

import httpx
import pytest

from rag.api import Settings
from rag.api.routers.ui import STATIC_DIR
from tests.api.helpers import assert_error


@pytest.fixture(scope="module")
def server(serve, engine):
    with serve(Settings(), engine=engine) as srv:
        yield srv


def test_page_and_assets(server):
    page = httpx.get(server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for asset in re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text):
        reply = httpx.get(server.url + asset)
        assert reply.status_code == 200, asset
    assert httpx.get(server.url + "/static/app.js").headers["content-type"].startswith("text/javascript")


def test_no_external_resources():
    for path in STATIC_DIR.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"(?:src|href)=\"https?://", text), path
        assert "@import" not in text and "cdn" not in text.lower(), path
        assert "innerHTML" not in text, path  # untrusted text goes through textContent


def test_only_known_assets(server):
    for name in ("../settings.py", "..%2Fsettings.py", "nope.js", "%2e%2e%2f%2e%2e%2fapp.py"):
        reply = httpx.get(server.url + "/static/" + name)
        assert reply.status_code == 404, name
    assert_error(httpx.get(server.url + "/static/nope.js"), 404)


def test_ui_can_be_turned_off(serve, engine):
    with serve(Settings(enable_ui=False), engine=engine) as srv:
        assert httpx.get(srv.url + "/").status_code == 404
        assert httpx.get(srv.url + "/healthz").status_code == 200
