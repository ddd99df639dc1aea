"""The benchmark's prefixrag server (rag/benchmark/served.py) keeps an index of its own: it starts
while another writer holds the configured index directory (a user's `prefixrag serve`), and leaves
nothing behind."""

from __future__ import annotations

from rag.benchmark.served import PrefixragServer
from rag.stores.local.lock import DirectoryLock


def test_starts_while_another_writer_holds_the_index(tmp_path, monkeypatch):
    index = tmp_path / "index"
    monkeypatch.setenv("PREFIXRAG_INDEX_DIR", str(index))  # what a server started here would open
    index.mkdir()
    holder = DirectoryLock(index).acquire()  # this process is that directory's single writer now
    try:
        server = PrefixragServer(log_dir=tmp_path)
        with server:
            assert server.info()["state"] == "ready"
        assert not server.log_path.with_suffix(".index").exists()
    finally:
        holder.release()
