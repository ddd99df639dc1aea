"""One parse of a GGUF file per conversion.

Loading a tokenizer and a model from one GGUF file, transformers parses the whole file four times
(the tokenizer, the config twice, the tensors; each parse reads every vocabulary string and merge)
and rebuilds gguf's tensor-name map once per tensor. Within
``shared_gguf_reads()`` every parse of a path returns the first one's reader, and a name map is built
once per architecture and layer count: the file and the maps do not change while it lasts.

Example:
    >>> with shared_gguf_reads():                                        # doctest: +SKIP
    ...     tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ...     model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["shared_gguf_reads"]


@contextlib.contextmanager
def shared_gguf_reads() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader(path)`` parses each path once (read-only mode) and
    ``gguf.get_tensor_name_map`` builds each map once; both are restored after it. transformers
    imports them from ``gguf`` when it reads a file, so it sees the shared ones."""
    import gguf as gguf_module

    gguf: Any = gguf_module  # its attributes are replaced for the block
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, Any] = {}

    def shared_reader(path: os.PathLike[str] | str, mode: Any = "r") -> Any:
        if mode != "r":  # a writable map is the caller's own
            return reader_class(path, mode)
        key = os.path.realpath(path)
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map
