"""The record files of a disk tier's folder, by kind: KV blocks (whole or partial) and links."""

from __future__ import annotations

from pathlib import Path

from engine.tiers.blockfile import read_head
from engine.tiers.blockformat import BlockError, parse_header


def _is_link(path: Path) -> bool:
    try:
        header, _ = parse_header(memoryview(read_head(path)))
    except BlockError:  # a damaged file is no link
        return False
    return "link" in header


def block_files(folder: Path) -> list[Path]:
    """Files holding KV (whole 64-token blocks and partial ones)."""
    return [p for p in sorted(folder.rglob("*.kvb")) if not _is_link(p)]


def link_files(folder: Path) -> list[Path]:
    """Link files (the latest whole block after a parent, by its first token)."""
    return [p for p in sorted(folder.rglob("*.kvb")) if _is_link(p)]
