"""The disk KV tier with the real model: reuse after a restart, exactness, damaged and foreign files,
the byte budget, a full disk, tenant isolation, several engines on one folder, and warming."""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.kv import BLOCK_TOKENS
from engine.tiers.blockfile import read_block_file
from tests.api.helpers import wait_until
from tests.engine.tiers.records import block_files, link_files

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)
TEXT = "Disk blocks survive a restart and are shared by replicas of one model. " * 16


def _engine(loaded, folder: Path | None, *, model_id: str | None = None, **config) -> Engine:
    cfg = EngineConfig(disk_cache_dir=folder, **config) if folder is not None else EngineConfig(**config)
    return Engine(loaded.model, loaded.tokenizer, model_id=model_id or loaded.model_id, config=cfg)


@pytest.fixture(scope="module")
def reference(loaded_model):
    """Caching off: what every reuse must reproduce."""
    eng = _engine(loaded_model, None, enable_prefix_cache=False)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompt(loaded_model) -> list[int]:
    ids = loaded_model.tokenizer.encode(TEXT)[:200]
    assert len(ids) == 200
    return ids


def _write(loaded, folder: Path, prompt, namespace: str = "", **config) -> dict:
    eng = _engine(loaded, folder, **config)
    try:
        eng.generate(prompt, GREEDY, namespace=namespace)
        assert eng.disk is not None and eng.disk.flush(60)
        return eng.stats()["disk"]
    finally:
        eng.close()


@pytest.fixture(scope="module")
def expected(reference, prompt) -> list[int]:
    """The greedy answer to ``prompt`` with caching off."""
    return reference.generate(prompt, GREEDY).token_ids


@pytest.fixture(scope="module")
def written(loaded_model, prompt, tmp_path_factory) -> tuple[Path, dict]:
    """A folder an engine (default config) wrote ``prompt``'s blocks to, and its disk stats after the
    flush; a test copies the folder (``_copy``) and changes only its copy."""
    folder = tmp_path_factory.mktemp("written")
    return folder, _write(loaded_model, folder, prompt)


@pytest.fixture(scope="module")
def foreign_block(loaded_model, prompt, tmp_path_factory) -> Path:
    """A block file another model (another id) wrote for ``prompt``."""
    folder = tmp_path_factory.mktemp("theirs")
    _write(loaded_model, folder, prompt, model_id="another-model")
    return block_files(folder)[0]


def _copy(written: tuple[Path, dict], to: Path) -> dict:
    """The written folder's files (their modification times too) into ``to``; the writer's disk stats."""
    shutil.copytree(written[0], to, dirs_exist_ok=True)
    return written[1]


def _files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.kvb"))


def test_a_restarted_engine_reads_the_disk_tier_and_promotes_it_to_ram(
    loaded_model, written, expected, prompt, tmp_path
):
    written = _copy(written, tmp_path)
    # 200 tokens: 3 whole blocks (each with a link at its first token) and the 8 after them; the answer's
    # insert rewrote that partial block longer
    assert written["written_blocks"] == 5 and len(block_files(tmp_path)) == 4
    assert len(link_files(tmp_path)) == 3
    assert written["used_bytes"] == sum(
        p.stat().st_size for p in _files(tmp_path)
    )  # the rewrite counted once
    eng = _engine(loaded_model, tmp_path)  # a restart: empty RAM cache, same folder
    try:
        first = eng.generate(prompt, GREEDY)
        assert first.cached_tokens == len(prompt) - 1 and first.token_ids == expected  # as from RAM
        assert first.phases["tiers"] > 0
        again = eng.generate(prompt, GREEDY)  # promoted: RAM serves it, and the logits saved just now
        assert again.cached_tokens == len(prompt) and again.token_ids == expected
        disk = eng.stats()["disk"]
        assert (disk["hit_requests"], disk["hit_tokens"], disk["read_blocks"]) == (1, 199, 4)
        assert disk["read_bytes"] == (192 + 11) * 46_080 and disk["rejected"] == 0  # the last block: 8 + 3
    finally:
        eng.close()


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "float16", "int8"])
def test_logits_from_disk_equal_computed_logits(loaded_model, prompt, tmp_path, kv_dtype):
    _write(loaded_model, tmp_path, prompt, kv_dtype=kv_dtype)
    eng = _engine(loaded_model, tmp_path, kv_dtype=kv_dtype)
    try:
        runner, ns = eng.runner, eng._namespace("")
        computed = runner.new_buffer(len(prompt))
        runner.prefill(prompt, computed)  # what the writing engine computed
        computed.truncate(199)
        loaded = runner.new_buffer(len(prompt))
        assert eng.disk is not None and eng.disk.extend(loaded, prompt, ns, limit=len(prompt) - 1) == 199
        for got, want in zip(loaded.stores(), computed.stores()):
            assert torch.equal(got[:, :, :, :199], want[:, :, :, :199])
        assert torch.equal(runner.prefill(prompt[199:], loaded), runner.prefill(prompt[199:], computed))
        sizes = sorted(p.stat().st_size for p in block_files(tmp_path))
        per_token = eng.stats()["kv"]["bytes_per_token"]
        assert all(BLOCK_TOKENS * per_token < s < BLOCK_TOKENS * per_token + 4096 for s in sizes[1:])
        assert (
            11 * per_token < sizes[0] < 11 * per_token + 4096
        )  # the partial block: 8 prompt + 3 answer tokens
    finally:
        eng.close()


def test_the_writer_yields_the_cpu_to_the_model(loaded_model, tmp_path):
    eng = _engine(loaded_model, tmp_path)
    try:
        writer = eng.disk.writer.thread
        assert wait_until(lambda: writer.native_id is not None)
        assert wait_until(lambda: os.getpriority(os.PRIO_PROCESS, writer.native_id) == 19)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # only the writer
    finally:
        eng.close()


def test_at_least_one_prompt_token_is_computed(loaded_model, written, prompt, tmp_path):
    _copy(written, tmp_path)
    eng = _engine(loaded_model, tmp_path)
    try:
        r = eng.generate(prompt[:128], GREEDY)  # blocks 0 and 1 are on disk; the cap is 127 tokens
        assert r.cached_tokens == 127  # block 1 is used up to the cap, as RAM would
    finally:
        eng.close()


def _damage(path: Path, how: str, foreign: Path | None = None) -> None:
    data = bytearray(path.read_bytes())
    if how == "flipped byte":
        data[len(data) // 2] ^= 0x04
        path.write_bytes(bytes(data))
    elif how == "truncated":
        path.write_bytes(bytes(data[: len(data) - 4096]))
    elif how == "garbage":
        path.write_bytes(b"not a block" * 100)
    else:  # another model's block file under this model's address
        assert foreign is not None
        shutil.copyfile(foreign, path)


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "garbage", "another model's file"])
def test_a_damaged_or_foreign_block_is_a_miss_logged_and_deleted(
    loaded_model, written, foreign_block, expected, prompt, tmp_path, caplog, how
):
    _copy(written, tmp_path)
    eng = _engine(loaded_model, tmp_path)
    try:
        keys = _chain_keys(eng, prompt)
        victim = eng.disk.folder.path(keys[1])  # the middle block: block 0 still loads
        _damage(victim, how, foreign=foreign_block)
        with caplog.at_level(logging.WARNING, logger="engine.tiers.disk"):
            r = eng.generate(prompt, GREEDY)
        assert r.cached_tokens == BLOCK_TOKENS  # block 0 only; nothing after the bad block is used
        assert r.token_ids == expected
        assert eng.stats()["disk"]["rejected"] == 1
        assert any("rejected" in rec.message and keys[1] in rec.message for rec in caplog.records)
        eng.disk.flush(60)  # deleted, then the request's insert rewrote it from RAM: the tier heals
        assert (
            victim.exists() and read_block_file(victim, *_expect(eng, prompt, keys, 1))[0] == prompt[64:128]
        )
    finally:
        eng.close()


def _chain_keys(eng: Engine, prompt: list[int]) -> list[str]:
    from engine.tiers.addresses import block_hashes

    assert eng.disk is not None
    return block_hashes(eng.disk.addresses.root(eng._namespace("")), prompt)


def _expect(eng: Engine, prompt: list[int], keys: list[str], j: int) -> tuple:
    tier = eng.disk
    assert tier is not None
    b = BLOCK_TOKENS
    meta = tier.addresses.meta(keys, eng._namespace(""), j * b, keys[j], prompt[j * b : (j + 1) * b])
    return meta, tier._shapes, tier.codec.stored_dtype


def test_other_models_formats_and_tenants_never_read_a_block(loaded_model, prompt, tmp_path):
    _write(loaded_model, tmp_path, prompt, namespace="tenant-a")
    for model_id, kv_dtype, namespace in (
        ("another-model", "float32", "tenant-a"),
        (None, "int8", "tenant-a"),
        (None, "float32", "tenant-b"),
        (None, "float32", ""),
    ):
        eng = _engine(loaded_model, tmp_path, model_id=model_id, kv_dtype=kv_dtype)
        try:
            assert eng.generate(prompt, GREEDY, namespace=namespace).cached_tokens == 0, (
                model_id,
                kv_dtype,
                namespace,
            )
            assert eng.stats()["disk"]["rejected"] == 0  # not even looked at: the addresses differ
        finally:
            eng.close()
    eng = _engine(loaded_model, tmp_path)
    try:
        assert eng.generate(prompt, GREEDY, namespace="tenant-a").cached_tokens == 199  # still there
    finally:
        eng.close()


def test_the_budget_holds_and_keeps_prefix_heads(loaded_model, reference, prompt, tmp_path):
    block_file = BLOCK_TOKENS * 11_880 + 4096  # an int8 block and its header
    budget = 2 * block_file + 8192  # two blocks of a three-block prefix
    eng = _engine(loaded_model, tmp_path, kv_dtype="int8", disk_cache_bytes=budget)
    other = list(reversed(prompt))
    try:
        eng.generate(prompt, GREEDY)
        eng.generate(other, GREEDY)
        assert eng.disk is not None and eng.disk.flush(60)
        disk = eng.stats()["disk"]
        assert sum(p.stat().st_size for p in _files(tmp_path)) <= budget
        assert disk["used_bytes"] <= budget and disk["write_dropped"] >= 1
    finally:
        eng.close()
    fresh = _engine(loaded_model, tmp_path, kv_dtype="int8", disk_cache_bytes=budget)
    plain = _engine(loaded_model, None, kv_dtype="int8", enable_prefix_cache=False)
    try:
        r = fresh.generate(other, GREEDY)
        assert r.cached_tokens in (64, 128) and r.token_ids == plain.generate(other, GREEDY).token_ids
    finally:
        fresh.close()
        plain.close()


def test_a_full_disk_is_a_skipped_write_not_an_error(loaded_model, expected, prompt, small_tmpfs, caplog):
    eng = _engine(loaded_model, small_tmpfs)  # 64 KiB: no float32 block (2.9 MB) fits
    try:
        with caplog.at_level(logging.WARNING, logger="engine.tiers.disk"):
            r = eng.generate(prompt, GREEDY)
            assert eng.disk.flush(60)
        assert r.token_ids == expected
        assert eng.stats()["disk"]["write_errors"] >= 1
        assert any("cannot write" in rec.message for rec in caplog.records)
        assert eng.generate(prompt, GREEDY).cached_tokens == len(prompt)  # RAM still serves (and its logits)
        assert eng.disk.flush(60)  # that request's writes too: a temp file exists while one is under way
        assert not [p for p in small_tmpfs.rglob("*") if p.is_file()]
    finally:
        eng.close()


def test_engines_sharing_a_folder_write_and_read_concurrently(loaded_model, reference, prompt, tmp_path):
    prompts = [prompt[i:] + prompt[:i] for i in (0, 7, 0, 7)]  # two prompts, each from two engines
    engines = [_engine(loaded_model, tmp_path) for _ in range(2)]
    results: dict[int, list[int]] = {}
    try:
        threads = [
            threading.Thread(
                target=lambda i=i: results.__setitem__(
                    i, engines[i % 2].generate(prompts[i], GREEDY).token_ids
                )
            )
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for eng in engines:
            assert eng.disk is not None and eng.disk.flush(60)
        assert len(block_files(tmp_path)) == 8  # per prompt: 3 whole blocks and the partial one
        assert len(link_files(tmp_path)) == 6  # and a link at each whole block's first token
        want = [reference.generate(p, GREEDY).token_ids for p in prompts[:2]]  # prompts[2:] repeat them
        for i in range(4):
            assert results[i] == want[i % 2]
    finally:
        for eng in engines:
            eng.close()
    late = _engine(loaded_model, tmp_path)  # a new replica finds both prefixes
    try:
        assert [late.generate(p, GREEDY).cached_tokens for p in prompts[:2]] == [199, 199]
        assert late.stats()["disk"]["rejected"] == 0
    finally:
        late.close()


def test_warm_writes_through_to_disk(loaded_model, prompt, tmp_path):
    eng = _engine(loaded_model, tmp_path)
    try:
        result = eng.warm([prompt, prompt[:70]], namespace="faq")
        assert (result.prompts, result.prompt_tokens, result.disk_written) == (2, 270, True)
        assert result.cached_tokens == 69  # the second prompt is a prefix of the first
        with pytest.raises(ValueError, match=r"empty|prompt 1"):
            eng.warm(["fine", []])
    finally:
        eng.close()
    # 3 whole blocks and the partial one after block 2; the 70-token prompt's last 6 tokens start block 1,
    # which the link at its first token already names
    assert len(block_files(tmp_path)) == 4 and len(link_files(tmp_path)) == 3
    fresh = _engine(loaded_model, tmp_path)
    try:
        # block 0 and 6 tokens of block 1 (through its link), before RAM holds anything
        assert fresh.generate(prompt[:70] + [42], GREEDY, namespace="faq").cached_tokens == 70
        assert fresh.stats()["disk"]["hit_tokens"] == 70
        assert fresh.generate(prompt, GREEDY, namespace="faq").cached_tokens == 199
    finally:
        fresh.close()


def test_an_unusable_folder_turns_the_tier_off(loaded_model, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="engine.tiers.disk"):
        eng = _engine(loaded_model, blocker / "kv")
    try:
        assert eng.disk is None and eng.stats()["disk"] is None
        assert any("disk KV tier off" in rec.message for rec in caplog.records)
        assert eng.generate("Hello there", GREEDY).token_ids
    finally:
        eng.close()
