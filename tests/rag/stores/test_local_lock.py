"""One writer per local index directory: a second one is refused at once with an error naming the
shared store to use, in this process or another, and a writer that dies lets the next one in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag.deploy.cluster import Cluster
from rag.knowledge_base import KnowledgeBase
from rag.stores import LocalStore, StoreLocked
from rag.types import Document

REPO = Path(__file__).resolve().parents[3]
HOLDER = """
import sys, time
from rag.stores.local.lock import DirectoryLock
lock = DirectoryLock(__import__("pathlib").Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(600)
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_a_second_writer_in_the_same_process_is_refused_and_nothing_is_lost(make_kb, embedder, tmp_path):
    first = make_kb()
    first.add_documents([Document(id="a", text="The first writer's note.")])
    first.save(tmp_path)  # an export: the directory is free again afterwards
    one = KnowledgeBase.load(tmp_path, embedder=embedder)
    two = KnowledgeBase.load(tmp_path, embedder=embedder)  # readers take no lock
    one.add_documents([Document(id="b", text="Acknowledged through the first writer.")])
    with pytest.raises(StoreLocked, match="--document-store postgresql://") as refused:
        two.add_documents([Document(id="c", text="Never acknowledged.")])
    assert str(tmp_path) in str(refused.value) and "this process" in str(refused.value)
    assert "c" not in two  # the refused write is not visible either
    reread = KnowledgeBase.load(tmp_path, embedder=embedder)
    assert {d.id for d in reread.list_documents()} == {"a", "b"}
    one.close()
    two.add_documents([Document(id="c", text="Now the only writer.")])  # released by close()
    assert {d.id for d in KnowledgeBase.load(tmp_path, embedder=embedder).list_documents()} == {"a", "b", "c"}
    two.close()


def test_claim_refuses_before_any_work_and_close_releases(tmp_path):
    held = LocalStore(tmp_path / "index")
    held.claim()
    other = LocalStore(tmp_path / "index")
    with pytest.raises(StoreLocked, match="single writer"):
        other.claim()
    held.close()
    other.claim()
    other.close()


def test_another_process_is_refused_at_startup_until_the_holder_dies(tmp_path):
    from typer.testing import CliRunner

    from rag.cli import app
    from rag.stores.local.lock import DirectoryLock

    index = tmp_path / "index"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(index)], env=_env(), stdout=subprocess.PIPE, cwd=REPO
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        notes = tmp_path / "notes.md"
        notes.write_text("# Notes\n\nThe ferry leaves at 7:40.\n")
        t0 = time.monotonic()
        serve = subprocess.run(  # a server process: refused before it loads a model
            [sys.executable, "-m", "rag.cli", "serve", "--port", "0", "--index", str(index)],
            env=_env(),
            capture_output=True,
            timeout=120,
        )
        refused_in = time.monotonic() - t0
        ingest = CliRunner().invoke(app, ["ingest", str(notes), "--index", str(index)])
        outputs = [
            (serve.returncode, serve.stdout.decode() + serve.stderr.decode()),
            (ingest.exit_code, ingest.output),
        ]
        for code, output in outputs:
            out = " ".join(output.split())  # unwrapped
            assert code == 2, out
            assert f"pid {holder.pid}" in out and "--document-store postgresql://" in out, out
        assert refused_in < 60
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    DirectoryLock(index).acquire().release()  # the kernel dropped the dead holder's lock


def test_a_cluster_refuses_to_share_one_index_directory(tmp_path):
    with pytest.raises(ValueError, match=r"single writer.*--document-store"):
        Cluster(2, index_dir=tmp_path / "index", log_dir=tmp_path / "logs")
    with pytest.raises(ValueError, match="two stores"):
        Cluster(1, index_dir=tmp_path / "index", document_store="postgresql://x@127.0.0.1/db")
    assert Cluster(1, index_dir=tmp_path / "index", log_dir=tmp_path / "logs").replicas[0].index_dir
