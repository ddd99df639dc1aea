"""The web page in headless Chromium (Debian's package, driven by Playwright; nothing downloads a browser):
type a question, see the answer stream in, its sources, TTFT, cached tokens and the cache hit rate.

Without Chromium the test skips, except under ``CI`` (set by CI services and by ``.ci/run``), where a
missing browser fails the run: CI must never pass without opening the page."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright import sync_api

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

IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")

pytestmark = pytest.mark.browser

PERCENT = re.compile(r"^\d+(\.\d)?%$")
STREAMING = re.compile(r"\bstreaming\b")
DOCS = [
    {
        "id": "lighthouse.md",
        "text": "# Lighthouse\n\nThe Kerbrat lighthouse was built in 1881 and is 42 metres tall.",
    },
    {"id": "keeper.md", "text": "# Keeper\n\nThe last keeper of the Kerbrat lighthouse was Marie Le Goff."},
]


def require_chromium(path: Path, in_ci: bool) -> Path:
    """``path`` if Chromium is there; else a skip, or under CI a failure."""
    if not path.exists():
        missing = f"no Chromium at {path} (apt-get install chromium, or set PREFIXRAG_CHROMIUM)"
        if in_ci:
            pytest.fail(f"CI is set and the browser test cannot run: {missing}", pytrace=False)
        pytest.skip(missing)
    return path


@pytest.fixture(scope="session", autouse=True)  # session: set up before the engine it would load for nothing
def chromium() -> Path:
    """The browser, checked before anything else is built."""
    return require_chromium(CHROMIUM, IN_CI)


@pytest.fixture(scope="module")
def server(serve, engine, tmp_path_factory):
    import httpx

    from rag.api.services import build_pipeline

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


def test_the_page_shows_the_callers_collections(serve, engine, browser, tmp_path):
    """With tenant keys: the page lists the key's collections (its own, the shared one read-only),
    uploads into its own, and a question narrowed to one collection cites only that one."""
    import httpx

    from rag.api.services import build_pipeline

    alice, admin = "sk-alice-web-0001", "sk-admin-web-0001"
    settings = Settings(
        api_keys={alice: "alice", "sk-bob-web-00002": "bob"},
        admin_key=admin,
        index_dir=tmp_path / "index",
        rag={"max_tokens": 8},
    )
    with serve(settings, pipeline=build_pipeline(settings, engine)) as srv:
        added = httpx.post(
            srv.url + "/v1/documents?collection=shared",
            json=DOCS,
            headers={"Authorization": f"Bearer {admin}"},
            timeout=120,
        )
        assert added.status_code == 201, added.text
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(srv.url + "/")
        page.locator("#key-panel summary").click()
        page.fill("#api-key", alice)
        page.dispatch_event("#api-key", "change")
        page.locator("#docs-panel summary").click()
        listing = page.locator("#collection-list")
        sync_api.expect(listing).to_contain_text("alice (yours): 0 documents", timeout=15_000)
        sync_api.expect(listing).to_contain_text("shared (read-only): 2 documents")
        assert page.locator("#upload-target option").all_inner_texts() == ["alice"]  # writable ones only
        assert page.locator("#scope option").all_inner_texts() == ["all my collections", "alice", "shared"]
        upload = tmp_path / "mine.md"
        upload.write_text(
            "# Mine\n\nAlice's lighthouse note: the lamp was replaced in 1990.", encoding="utf-8"
        )
        page.set_input_files("#upload", str(upload))
        page.locator("#upload-form button").click()
        sync_api.expect(page.locator("#doc-status")).to_contain_text("added 1 to alice", timeout=60_000)
        sync_api.expect(listing).to_contain_text("alice (yours): 1 document")
        sync_api.expect(page.locator("#doc-list")).to_contain_text("alice · ")

        page.select_option("#scope", "shared")
        page.fill("#question", "How tall is the Kerbrat lighthouse?")
        page.press("#question", "Enter")
        sync_api.expect(page.locator("#answer")).not_to_have_class(STREAMING, timeout=120_000)
        cited = page.locator("#sources .src-id").all_inner_texts()
        assert cited and all(c.startswith("shared / ") for c in cited), cited
        page.screenshot(path=str(tmp_path / "collections.png"), full_page=True)
        assert not errors, errors
        page.close()
