import os
from pathlib import Path

import pytest

from rag.ingestion.loaders import html_to_text, load_paths, load_python_reference


def minimal_pdf(pages: list[str]) -> bytes:
    """A valid PDF with one line of Helvetica text per page (xref offsets computed)."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objs.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objs.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
            f"/Resources << /Font << /F1 3 0 R >> >> >>".encode()
        )
        objs.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objs, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % off for off in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "guide").mkdir(parents=True)
    (root / "notes.txt").write_text("Plain notes.\n\nSecond paragraph.", encoding="utf-8")
    (root / "guide" / "intro.md").write_text("# Intro\n\nWelcome to *prefixrag*.", encoding="utf-8")
    (root / "guide" / "page.html").write_text(
        "<html><head><title>A page</title><style>p {color: red}</style></head><body>"
        "<h1>Heading</h1><p>Visible &amp; kept.</p><script>var hidden = 1;</script><p>Second</p></body></html>",
        encoding="utf-8",
    )
    (root / "report.pdf").write_bytes(minimal_pdf(["Quarterly report page one", "Page two text"]))
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00")
    (root / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    (root / "empty.md").write_text("", encoding="utf-8")
    (root / "blank.txt").write_text("  \n\n ", encoding="utf-8")
    (root / ".hidden.txt").write_text("secret", encoding="utf-8")
    return root


def test_folder_is_loaded_recursively_with_relative_ids(tree):
    result = load_paths(tree)
    docs = {d.id: d for d in result.documents}
    assert sorted(docs) == ["guide/intro.md", "guide/page.html", "notes.txt", "report.pdf"]
    assert docs["notes.txt"].text == "Plain notes.\n\nSecond paragraph."
    assert docs["guide/intro.md"].metadata["format"] == "markdown"
    assert Path(docs["notes.txt"].metadata["source"]) == (tree / "notes.txt").resolve()


def test_ids_are_stable_across_spellings_of_the_root(tree, monkeypatch):
    monkeypatch.chdir(tree.parent)
    first = [d.id for d in load_paths("docs").documents]
    second = [d.id for d in load_paths(str(tree) + os.sep).documents]
    assert first == second


def test_html_is_text_only(tree):
    doc = next(d for d in load_paths(tree).documents if d.id == "guide/page.html")
    assert doc.text == "Heading\n\nVisible & kept.\n\nSecond"
    assert doc.metadata["title"] == "A page"
    assert "hidden" not in doc.text and "color" not in doc.text


def test_pdf_text_is_extracted(tree):
    doc = next(d for d in load_paths(tree).documents if d.id == "report.pdf")
    assert "Quarterly report page one" in doc.text and "Page two text" in doc.text
    assert doc.metadata["pages"] == 2 and doc.metadata["format"] == "pdf"


def test_unusable_files_are_skipped_with_reasons(tree):
    reasons = {Path(s.path).name: s.reason for s in load_paths(tree).skipped}
    assert "binary" in reasons["image.png"]
    assert "not UTF-8" in reasons["latin1.txt"] and "0xe9" in reasons["latin1.txt"]
    assert reasons["empty.md"].startswith("empty")
    assert reasons["blank.txt"].startswith("empty")
    assert reasons[".hidden.txt"] == "hidden file"


def test_links_special_files_and_bad_pdf_are_skipped(tmp_path):
    (tmp_path / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf")
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    os.mkfifo(tmp_path / "pipe.txt")
    reasons = {Path(s.path).name: s.reason for s in load_paths(tmp_path).skipped}
    assert reasons["gone.txt"].startswith("unreadable")
    assert "PDF" in reasons["broken.pdf"]
    assert "not followed" in reasons["linked"]
    assert reasons["pipe.txt"] == "not a regular file"


def test_single_files_and_utf8_bom(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfhello")
    (tmp_path / "b.rst").write_text("Title\n=====\n\nbody", encoding="utf-8")
    result = load_paths([tmp_path / "a.txt", tmp_path / "b.rst"])
    assert [(d.id, d.text) for d in result.documents] == [
        ("a.txt", "hello"),
        ("b.rst", "Title\n=====\n\nbody"),
    ]


def test_missing_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope"):
        load_paths([tmp_path, missing])


def test_duplicate_ids_are_an_error(tmp_path):
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "same.txt").write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match=r"same\.txt"):
        load_paths([tmp_path / "a", tmp_path / "b"])


def test_html_entities_and_blocks():
    text, title = html_to_text("<div>a<br>b</div><ul><li>one</li><li>two &lt;3</li></ul>")
    assert text == "a\n\nb\n\none\n\ntwo <3" and title == ""


def test_python_reference_corpus():
    docs = load_python_reference()
    by_id = {d.id: d for d in docs}
    assert len(docs) > 50
    assert by_id["pass"].metadata == {"topic": "pass"}
    assert "null operation" in by_id["pass"].text
