"""One parse of a GGUF file per conversion: readers and tensor-name maps shared within the block,
gguf's own restored after it."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.gguf_reads import shared_gguf_reads


def _write_gguf(path) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_each_file_is_parsed_once_within_the_block(tmp_path):
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    _write_gguf(first)
    _write_gguf(second)
    with shared_gguf_reads():
        reader = gguf.GGUFReader(first)
        assert gguf.GGUFReader(str(first)) is reader  # the same file by another spelling
        assert gguf.GGUFReader(second) is not reader
        assert np.array_equal(reader.tensors[0].data, np.arange(12, dtype=np.float32).reshape(3, 4))
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is names
        assert names.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"


def test_gguf_is_restored_after_the_block_even_on_error(tmp_path):
    path = tmp_path / "a.gguf"
    _write_gguf(path)
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(KeyError), shared_gguf_reads():
        raise KeyError("inside")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map)
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)
