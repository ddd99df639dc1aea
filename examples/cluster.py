"""Run N prefixrag replicas behind sglang-router on this machine, until Ctrl-C.

    python examples/cluster.py --replicas 2 --policy cache_aware          # prints the router URL
    python examples/cluster.py --replicas 3 --policy round_robin --port 30000 --index ~/my-index

Then point any OpenAI client at ``<url>/v1`` (or ``engine.RemoteEngine(url, model)``). Ctrl-C or
SIGTERM stops the router and every replica (each finishes its in-flight requests first); nothing is
left running. Needs ``pip install sglang-router`` (in the ``dev`` and ``router`` extras).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
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
    p.add_argument("--index", type=Path, help="index every replica opens (default: an empty one each)")
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
    cluster = Cluster(
        args.replicas,
        args.policy,
        host=args.host,
        port=args.port,
        model=args.model,
        index_dir=args.index.expanduser() if args.index else None,
        threads_per_replica=args.threads,
        warm_up=args.warm_up,
        log_dir=args.log_dir,
    )
    print(f"starting {args.replicas} replica(s) + sglang-router ({args.policy}); logs in {cluster.log_dir}")
    with cluster:
        for replica in cluster.replicas:
            print(f"  {replica.name}: {replica.url}")
        print(f"router ready: {cluster.url}   (OpenAI base_url: {cluster.url}/v1; Ctrl-C stops all)")
        sys.stdout.flush()
        stop.wait()
        print("stopping ...")
    print("stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
