"""Hostile input on the document routes: path-like and odd file names, huge and many-part uploads,
deep JSON, invalid UTF-8, NUL and control characters. Each is refused with a clear 4xx or stored
under a sanitised name, the server keeps serving, and nothing is written outside the data directory.

(The generic bad-input cases of the chat and ask routes are in tests/api/test_api_errors.py.)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import httpx
import pytest

from rag.api import Settings
from rag.api.documents_io import safe_filename
from tests.api.helpers import assert_error

BOUNDARY = b"prefixrag-hostile-boundary-7f3a"
MAX_BODY = 256 * 1024

# (raw filename bytes as sent, content)
HOSTILE_NAMES: list[tuple[bytes, bytes]] = [
    (b"../../etc/passwd.txt", b"Notes on the ferry timetable, part one."),
    (b"../../../../../../tmp/prefixrag-escape.md", b"# Escape\n\nThis must stay inside the index."),
    (b"/etc/cron.d/prefixrag-job.txt", b"Notes on the ferry timetable, part two."),
    (b"..\\..\\windows\\system32\\drivers.txt", b"Notes on the ferry timetable, part three."),
    (b"sub/dir/../../../up.txt", b"Notes on the ferry timetable, part four."),
    (b"\x1b[31mred\x07bell.txt", b"Notes on the ferry timetable, part five."),
    (b"caf\xc3\xa9 men\xc3\xbc \xe2\x80\xaetxt.md", b"Notes on the ferry timetable, part six."),
    (b"bad-utf8-\xff\xfe.txt", b"Notes on the ferry timetable, part seven."),
    (b"a" * 5000 + b".txt", b"Notes on the ferry timetable, part eight."),
    (b"..", b"Notes on the ferry timetable, part nine."),
    (b"", b"Notes on the ferry timetable, part ten."),
]


def multipart(parts: list[tuple[bytes, bytes]], field: bytes = b"file") -> tuple[bytes, dict[str, str]]:
    """A multipart/form-data body built by hand, so file names go out byte for byte."""
    body = b""
    for name, content in parts:
        body += b"--" + BOUNDARY + b"\r\n"
        body += b'Content-Disposition: form-data; name="' + field + b'"; filename="' + name + b'"\r\n'
        body += b"Content-Type: application/octet-stream\r\n\r\n" + content + b"\r\n"
    body += b"--" + BOUNDARY + b"--\r\n"
    return body, {"content-type": f"multipart/form-data; boundary={BOUNDARY.decode()}"}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sandbox")
    (root / "data").mkdir()
    (root / "tmp").mkdir()
    return root


@pytest.fixture(scope="module")
def http(serve, engine, sandbox):
    """A server whose data dir and temporary dir both live in the sandbox."""
    from rag.api.services import build_pipeline

    settings = Settings(index_dir=sandbox / "data", max_body_bytes=MAX_BODY, max_documents_per_request=20)
    pipeline = build_pipeline(settings.model_copy(update={"warm_up": False}), engine)
    saved = tempfile.tempdir
    tempfile.tempdir = str(sandbox / "tmp")  # where uploads are spooled and unpacked
    try:
        with serve(settings, pipeline=pipeline) as srv, httpx.Client(base_url=srv.url, timeout=120) as client:
            yield client
    finally:
        tempfile.tempdir = saved


def _files_outside_data(sandbox: Path) -> list[str]:
    return sorted(
        str(p.relative_to(sandbox))
        for p in sandbox.rglob("*")
        if p.is_file() and not p.is_relative_to(sandbox / "data")
    )


def _exists(path: Path) -> bool:
    try:
        return os.path.lexists(path)
    except (OSError, ValueError):  # a name no file system would take
        return False


def _escape_targets(sandbox: Path, raw: bytes) -> list[Path]:
    """Where a naive server would have written an upload of this name (relative to its dirs)."""
    name = raw.decode("utf-8", "replace").replace("\\", "/")
    bases = [sandbox / "data", sandbox / "tmp", Path.cwd()]
    return [Path(os.path.normpath(base / name)) for base in bases if name.strip("./")]


def test_path_like_and_odd_file_names_are_sanitised(http, sandbox):
    passwd_before = os.stat("/etc/passwd").st_mtime_ns
    targets = [t for raw, _ in HOSTILE_NAMES for t in _escape_targets(sandbox, raw)]
    existing = {t for t in targets if _exists(t)}
    stored = {}
    for raw, content in HOSTILE_NAMES:
        body, headers = multipart([(raw, content)])
        reply = http.post("/v1/documents", content=body, headers=headers)
        if reply.status_code == 201:
            [doc_id] = reply.json()["ids"]
            stored[raw] = doc_id
            assert doc_id == safe_filename(doc_id)  # a plain name: no directory, no control characters
            assert "/" not in doc_id and "\\" not in doc_id and ".." not in doc_id and len(doc_id) <= 128
            assert all(c.isprintable() and c.isascii() for c in doc_id), doc_id
            assert http.get(f"/v1/documents/{doc_id}").json()["text"] == content.decode()
        else:
            assert_error(reply, reply.status_code)
            assert 400 <= reply.status_code < 500, reply.text
    assert len(stored) >= 8, stored  # most are kept, under a safe name
    assert stored[b"../../etc/passwd.txt"] == "passwd.txt"
    assert os.stat("/etc/passwd").st_mtime_ns == passwd_before
    assert {t for t in targets if _exists(t)} == existing, "an upload escaped its directory"
    assert _files_outside_data(sandbox) == []  # temporary upload files are gone too
    assert http.get("/healthz").status_code == 200


def test_path_like_document_ids_are_only_keys(http, sandbox):
    """A JSON document may be *called* ../../etc/passwd: it is a key in the index, never a path."""
    doc = {"id": "../../etc/passwd", "text": "Not the password file: a note about ferries."}
    assert http.post("/v1/documents", json=[doc]).status_code == 201
    got = http.get("/v1/documents/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd")
    assert got.status_code == 200 and got.json()["text"] == doc["text"]
    assert not (sandbox / "etc").exists() and not (sandbox.parent / "etc").exists()
    assert http.delete("/v1/documents/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd").status_code == 200
    assert _files_outside_data(sandbox) == []


@pytest.mark.parametrize(
    ("name", "content", "status", "code"),
    [
        (b"binary.txt", b"abc\x00def" * 10, 415, "unsupported_file"),
        (b"late-nul.txt", b"a" * 9000 + b"\x00", 415, "unsupported_file"),
        (b"latin1.txt", b"caf\xe9 cr\xe8me", 415, "unsupported_file"),
        (b"broken.pdf", b"%PDF-1.7\n1 0 obj << /Type /Catalog >> garbage", 415, "unsupported_file"),
        (b"lone-surrogate.txt", b"\xff\xfe" + b"\x00\xd8a\x00", 415, "unsupported_file"),
        (b"empty.md", b"   \n\t ", 415, "unsupported_file"),
        (b"program.exe", b"MZ\x90\x00", 415, "unsupported_file"),
    ],
)
def test_unreadable_uploads_are_refused(http, sandbox, name, content, status, code):
    body, headers = multipart([(name, content)])
    assert_error(http.post("/v1/documents", content=body, headers=headers), status, code=code)
    assert _files_outside_data(sandbox) == []


def test_control_characters_in_text_are_kept_verbatim_in_documents(http):
    """Control characters inside a document's text are data: stored and returned exactly (JSON-escaped),
    never interpreted; only NUL is refused (binary)."""
    text = "Bell \x07, escape \x1b[2J, DEL \x7f, C1 \x85 and a tab\tend."
    body, headers = multipart([(b"controls.txt", text.encode())])
    reply = http.post("/v1/documents", content=body, headers=headers)
    assert reply.status_code == 201, reply.text
    assert http.get("/v1/documents/controls.txt").json()["text"] == text
    assert_error(http.post("/v1/documents", json=[{"text": "a\x00b"}]), 422, code="invalid_document")
    for bad_id in ("\x1b[2J", "tab\tid", "nul\x00id", " "):
        assert_error(http.post("/v1/documents", json=[{"id": bad_id, "text": "x"}]), 422)


def test_huge_and_many_part_uploads(http, sandbox):
    big, headers = multipart([(b"big.txt", b"ferry " * (MAX_BODY // 6 + 100))])
    assert_error(http.post("/v1/documents", content=big, headers=headers), 413, code="request_too_large")

    def chunks():  # no Content-Length: counted while reading
        for i in range(0, len(big), 16384):
            yield big[i : i + 16384]

    assert_error(http.post("/v1/documents", content=chunks(), headers=headers), 413, code="request_too_large")
    many, headers = multipart([(f"n{i}.txt".encode(), b"x") for i in range(25)])  # limit is 20 files
    reply = http.post("/v1/documents", content=many, headers=headers)
    assert 400 <= reply.status_code < 500, reply.text
    assert_error(reply, reply.status_code)
    fields = b"".join(
        b"--"
        + BOUNDARY
        + b'\r\nContent-Disposition: form-data; name="f'
        + str(i).encode()
        + b'"\r\n\r\nv\r\n'
        for i in range(3000)
    )
    reply = http.post("/v1/documents", content=fields + b"--" + BOUNDARY + b"--\r\n", headers=headers)
    assert 400 <= reply.status_code < 500, reply.text
    dup, headers = multipart([(b"same.txt", b"one"), (b"dir/same.txt", b"two")])
    assert_error(http.post("/v1/documents", content=dup, headers=headers), 422, code="duplicate_name")
    broken = b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="file"; filename="x.txt"\r\n'
    reply = http.post("/v1/documents", content=broken, headers=headers)  # truncated mid-headers
    assert 400 <= reply.status_code < 500, reply.text
    assert _files_outside_data(sandbox) == []


@pytest.mark.parametrize("path", ["/v1/documents", "/v1/ask", "/v1/chat/completions"])
def test_deep_json_and_invalid_utf8_bodies(http, path):
    deep = b"[" * 100_000 + b"]" * 100_000
    assert_error(http.post(path, content=deep, headers={"content-type": "application/json"}), 400)
    invalid = {
        "/v1/documents": b'[{"text": "caf\xe9 au lait"}]',
        "/v1/ask": b'{"question": "caf\xe9?"}',
        "/v1/chat/completions": b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',
    }[path]
    err = assert_error(http.post(path, content=invalid, headers={"content-type": "application/json"}), 400)
    assert "json" in err["message"].lower() or "utf-8" in err["message"].lower(), err
    assert http.get("/healthz").status_code == 200


def test_metadata_nesting_is_bounded(http):
    def nested(depth: int) -> dict:
        value: dict = {"leaf": 1}
        for _ in range(depth - 1):
            value = {"n": value}
        return value

    ok = http.post("/v1/documents", json=[{"id": "nest-ok", "text": "n", "metadata": nested(8)}])
    assert ok.status_code == 201, ok.text
    assert_error(
        http.post("/v1/documents", json=[{"text": "n", "metadata": nested(40)}]), 422, contains="nested"
    )
