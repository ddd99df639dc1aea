"""The web page in headless Chromium (Debian's package, driven by Playwright; nothing downloads a browser):
type a question, see the answer stream in, its sources, TTFT, cached tokens and the cache hit rate."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from rag.api import Settings

CHROMIUM = Path(os.environ.get("PREFIXRAG_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytest.importorskip("rag.pipeline", reason="rag.pipeline (the Pipeline) is not available yet")

PERCENT = re.compile(r"^\d+(\.\d)?%$")
STREAMING = re.compile(r"\bstreaming\b")
DOCS = [
    {
        "id": "lighthouse.md",
        "text": "# Lighthouse\n\nThe Kerbrat lighthouse was built in 1881 and is 42 metres tall.",
    },
    {"id": "keeper.md", "text": "# Keeper\n\nThe last keeper of the Kerbrat lighthouse was Marie Le Goff."},
]


@pytest.fixture(scope="module")
def server(serve, engine, tmp_path_factory):
    import httpx

    from rag.api.pipeline_factory import build_pipeline

    settings = Settings(index_dir=tmp_path_factory.mktemp("web-index"))
    pipeline = build_pipeline(settings, engine)
    with serve(settings, pipeline=pipeline) as srv:
        assert httpx.post(srv.url + "/v1/documents", json=DOCS, timeout=120).status_code == 201
        yield srv


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def test_ask_in_the_browser(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url + "/")
    assert page.title() == "prefixrag"

    sync_api.expect(page.locator("#model")).not_to_have_text("…", timeout=15_000)
    page.fill("#question", "How tall is the Kerbrat lighthouse?")
    page.press("#question", "Enter")

    answer = page.locator("#answer")
    # streamed: text appears while the cursor (the .streaming class) is still on
    page.wait_for_function(
        "() => { const a = document.getElementById('answer');"
        " return a.textContent.length > 0 && a.classList.contains('streaming'); }",
        timeout=60_000,
    )
    sync_api.expect(answer).not_to_have_class(STREAMING, timeout=120_000)
    assert answer.inner_text().strip()

    sources = page.locator("#sources li")
    assert sources.count() >= 1
    assert "lighthouse.md" in page.locator("#sources").inner_text()
    ttft = page.locator("#ttft").inner_text()
    assert ttft.endswith("ms") or ttft.endswith(" s"), ttft
    cached = page.locator("#cached").inner_text()
    assert "/" in cached, cached

    # the same question again: the prompt's prefix comes from the cache
    page.press("#question", "Enter")
    sync_api.expect(answer).not_to_have_class(STREAMING, timeout=120_000)
    cached_again = int(page.locator("#cached").inner_text().split("/")[0])
    assert cached_again > 0
    sync_api.expect(page.locator("#hit-rate")).to_have_text(PERCENT, timeout=10_000)

    # chunks mode: the page sends it and shows the mode and the stitched tokens the answer reports
    page.select_option("#reuse", "chunks")
    page.fill("#question", "Who was the last keeper of the lighthouse?")
    page.press("#question", "Enter")
    sync_api.expect(page.locator("#mode")).to_have_text("chunks", timeout=120_000)
    sync_api.expect(answer).not_to_have_class(STREAMING, timeout=120_000)
    assert re.fullmatch(r"\d+ \(\d+ recomputed\)", page.locator("#stitched").inner_text())

    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    assert not errors, errors
    page.close()
