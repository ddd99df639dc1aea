"""Run N prefixrag replicas behind sglang-router on this machine, until Ctrl-C.

    python examples/cluster.py --replicas 2 --policy cache_aware          # prints the router URL
    python examples/cluster.py --replicas 3 --document-store postgresql://rag:secret@db:5432/rag
    python examples/cluster.py --replicas 2 --private-postgres            # a throwaway PostgreSQL
    python examples/cluster.py --replicas 1 --index ~/my-index            # one writer per directory

Then point any OpenAI client at ``<url>/v1`` (or ``engine.RemoteEngine(url, model)``). Ctrl-C or
SIGTERM stops the router and every replica (each finishes its in-flight requests first); nothing is
left running. Needs ``pip install sglang-router`` (in the ``dev`` and ``router`` extras).

With ``--document-store`` (or ``--private-postgres``, which starts a PostgreSQL of its own on
127.0.0.1 for trying it, removed again at exit) every replica serves the same documents: a document
added through any replica is served by the one that took it at once and by every other within a
second. An ``--index`` directory has a single writer, so it takes one replica only.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from rag.deploy.cluster import POLICIES, Cluster


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2, help="prefixrag serve processes (default 2)")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware", help="sglang-router policy")
    p.add_argument("--host", default="127.0.0.1", help="interface for the router and replicas")
    p.add_argument("--port", type=int, default=0, help="router port (default: a free one)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="registry name or HF model dir")
    store = p.add_mutually_exclusive_group()
    store.add_argument("--index", type=Path, help="a local index directory (one replica only: one writer)")
    store.add_argument(
        "--document-store", help="postgresql://user:password@host:port/db: one store every replica shares"
    )
    store.add_argument(
        "--private-postgres",
        action="store_true",
        help="start a throwaway PostgreSQL on 127.0.0.1 as the shared store (removed at exit)",
    )
    p.add_argument("--threads", type=int, help="torch threads per replica (default: cores / replicas)")
    p.add_argument("--log-dir", type=Path, help="where the processes' logs go (default: a temp dir)")
    p.add_argument("--warm-up", action="store_true", help="load the embedder at start, not on /v1/ask")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with shared_store(args) as store_url:
        try:
            cluster = Cluster(
                args.replicas,
                args.policy,
                host=args.host,
                port=args.port,
                model=args.model,
                index_dir=args.index.expanduser() if args.index else None,
                document_store=store_url,
                threads_per_replica=args.threads,
                warm_up=args.warm_up,
                log_dir=args.log_dir,
            )
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(
            f"starting {args.replicas} replica(s) + sglang-router ({args.policy}); logs in {cluster.log_dir}"
        )
        with cluster:
            for replica in cluster.replicas:
                print(f"  {replica.name}: {replica.url}")
            print(f"router ready: {cluster.url}   (OpenAI base_url: {cluster.url}/v1; Ctrl-C stops all)")
            sys.stdout.flush()
            stop.wait()
            print("stopping ...")
    print("stopped")
    return 0


@contextlib.contextmanager
def shared_store(args: argparse.Namespace) -> Iterator[str | None]:
    """The document store URL the replicas share: the one given, a private server's, or None."""
    if not args.private_postgres:
        yield args.document_store
        return
    from rag.deploy.postgres import PrivatePostgres

    with PrivatePostgres() as server:
        url = server.create_database("prefixrag")
        print(f"private PostgreSQL: {url}   (prefixrag ingest --document-store {url} DOCS)")
        sys.stdout.flush()
        yield url


if __name__ == "__main__":
    raise SystemExit(main())
