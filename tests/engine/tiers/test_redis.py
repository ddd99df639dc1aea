"""The Redis tier with the real model and a real redis-server (127.0.0.1, a database of this module's):
a replica on another home reads what another prefilled, as computed, and promotes it to its disk; a
prefix that ends inside a block; tenants, other models and formats never read a block; damaged,
truncated and foreign values are misses with a log line; a block that vanishes between lookup and
read; Redis's own eviction bounds the tier."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.kv import BLOCK_TOKENS
from engine.tiers.addresses import block_hashes
from engine.tiers.block_tier import BlockTier
from engine.tiers.blockformat import Block, BlockMeta, decode_record
from engine.tiers.redis_tier import KEY_PREFIX, RedisStore
from engine.tiers.stats import TIER_STATS
from tests.engine.reuse_helpers import assert_as_stated, real_text_ids
from tests.engine.tiers.records import block_files

GREEDY = SamplingParams(max_tokens=3, ignore_eos=True)
DB = 1
LOGGER = "engine.tiers.redis_tier"


@pytest.fixture(scope="module")
def url(redis_server) -> str:
    return redis_server.url(DB)


@pytest.fixture(autouse=True)
def client(redis_server):
    """This module's database, emptied before each test."""
    client = redis_server.client(DB)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="module")
def off(loaded_model):
    eng = Engine(
        loaded_model.model,
        loaded_model.tokenizer,
        model_id=loaded_model.model_id,
        config=EngineConfig(enable_prefix_cache=False),
    )
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompt(loaded_model) -> list[int]:
    return real_text_ids(loaded_model.tokenizer, 2 * BLOCK_TOKENS + 12)  # two whole blocks and 12 tokens


@pytest.fixture(scope="module")
def expected(off, prompt) -> list[int]:
    """The prompt's greedy answer with caching off."""
    return off.generate(prompt, GREEDY).token_ids


def _engine(
    loaded, *, url: str | None = None, home: Path | None = None, model_id: str | None = None, **config
):
    cfg = EngineConfig(remote_cache_url=url, disk_cache_dir=home / "kv" if home else None, **config)
    return Engine(loaded.model, loaded.tokenizer, model_id=model_id or loaded.model_id, config=cfg)


def _write(loaded, url: str, ids: list[int], namespace: str = "", **config) -> dict:
    eng = _engine(loaded, url=url, **config)
    try:
        eng.generate(ids, GREEDY, namespace=namespace)
        assert eng.tiers.flush(60)
        return eng.stats()["remote"]
    finally:
        eng.close()


def _keys(eng: Engine, ids: list[int], namespace: str = "") -> list[str]:
    remote = eng.tiers.get("remote")
    assert isinstance(remote, BlockTier)
    return block_hashes(remote.addresses.root(eng._namespace(namespace)), ids)


def test_a_replica_on_another_home_reads_what_another_prefilled(
    loaded_model, expected, prompt, url, tmp_path
):
    a = _engine(loaded_model, url=url, home=tmp_path / "a")
    try:
        a.generate(prompt, GREEDY)
        assert a.tiers.flush(60)
        written = a.stats()["remote"]
        assert written["written_blocks"] == 4 and written["write_errors"] == 0  # 2 whole, a partial twice
    finally:
        a.close()
    b = _engine(loaded_model, url=url, home=tmp_path / "b")  # another PREFIXRAG_HOME: its disk is empty
    try:
        r = b.generate(prompt, GREEDY)
        assert r.cached_tokens == len(prompt) - 1 and r.token_ids == expected
        stats = b.stats()
        assert stats["remote"]["hit_tokens"] == len(prompt) - 1 and stats["disk"]["hit_tokens"] == 0
        assert stats["remote"]["rejected"] == 0 and stats["remote"]["available"] == 1
        assert {s.key for s in TIER_STATS} <= set(stats["remote"]) & set(stats["disk"])  # named once
        assert b.tiers.flush(60)  # promoted: the request's insert wrote the blocks to B's own disk
    finally:
        b.close()
    assert len(block_files(tmp_path / "b" / "kv")) == 3
    local = _engine(loaded_model, home=tmp_path / "b")  # B restarted without Redis
    try:
        assert local.generate(prompt, GREEDY).cached_tokens == len(prompt) - 1
        assert local.stats()["disk"]["hit_tokens"] == len(prompt) - 1
    finally:
        local.close()


def test_logits_from_redis_are_as_computed(loaded_model, prompt, url):
    _write(loaded_model, url, prompt)
    eng = _engine(loaded_model, url=url)
    try:
        runner, n = eng.runner, len(prompt) - 1
        loaded = runner.new_buffer(len(prompt))
        assert eng.tiers.extend(loaded, prompt, eng._namespace(""), limit=n) == n
        cold = runner.prefill(prompt, runner.new_buffer(len(prompt)))
        assert_as_stated(runner, runner.prefill(prompt[n:], loaded), cold, "from Redis")
    finally:
        eng.close()


def test_a_prefix_ending_inside_a_block_comes_back_to_its_last_shared_token(loaded_model, off, url):
    system = real_text_ids(loaded_model.tokenizer, BLOCK_TOKENS + 30)
    tok = loaded_model.tokenizer
    first, probe = (system + tok.encode(f" {w}: say more about it.") for w in ("Harbours", "Lanterns"))
    _write(loaded_model, url, first)
    eng = _engine(loaded_model, url=url)
    try:
        r = eng.generate(probe, GREEDY)
        assert r.cached_tokens == len(system) and r.token_ids == off.generate(probe, GREEDY).token_ids
    finally:
        eng.close()


def test_tenants_other_models_and_formats_never_read_a_block(loaded_model, prompt, url):
    _write(loaded_model, url, prompt, namespace="tenant-a")
    for model_id, kv_dtype, namespace in (
        (None, "float32", "tenant-b"),
        (None, "float32", ""),
        ("another-model", "float32", "tenant-a"),
        (None, "int8", "tenant-a"),
    ):
        eng = _engine(loaded_model, url=url, model_id=model_id, kv_dtype=kv_dtype, check_exact_reuse=False)
        try:
            assert eng.generate(prompt, GREEDY, namespace=namespace).cached_tokens == 0, (model_id, kv_dtype)
            remote = eng.stats()["remote"]
            assert remote["lookups"] == 1 and remote["rejected"] == 0  # the addresses differ: never read
        finally:
            eng.close()
    eng = _engine(loaded_model, url=url)
    try:
        assert eng.generate(prompt, GREEDY, namespace="tenant-a").cached_tokens == len(prompt) - 1
    finally:
        eng.close()


@pytest.fixture(scope="module")
def written(loaded_model, redis_server, url, prompt) -> dict[bytes, bytes]:
    """Every value the prompt's blocks left in Redis, written by this model and by another."""
    client = redis_server.client(DB)
    client.flushdb()
    _write(loaded_model, url, prompt)
    _write(loaded_model, url, prompt, model_id="another-model")
    values = {key: client.get(key) for key in client.keys(KEY_PREFIX + "*")}
    client.close()
    return values


@pytest.mark.parametrize("how", ["flipped byte", "truncated", "garbage", "another model's value"])
def test_a_damaged_or_foreign_value_is_a_miss_logged_and_deleted(
    loaded_model, expected, prompt, url, client, written, caplog, how
):
    for key, value in written.items():
        client.set(key, value)
    eng = _engine(loaded_model, url=url)
    try:
        keys = _keys(eng, prompt)
        victim = KEY_PREFIX + keys[1]  # block 1: block 0 still loads
        value = bytearray(client.get(victim))
        if how == "flipped byte":
            value[len(value) // 2] ^= 0x04
        elif how == "truncated":
            value = value[: len(value) - 4096]
        elif how == "garbage":
            value = bytearray(b"\x80\x04K\x01." + bytes(100))  # a pickle, say: refused, never loaded
        else:
            other = _engine(loaded_model, url=url, model_id="another-model")
            value = bytearray(client.get(KEY_PREFIX + _keys(other, prompt)[1]))
            other.close()
        client.set(victim, bytes(value))
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            r = eng.generate(prompt, GREEDY)
        assert r.cached_tokens == BLOCK_TOKENS and r.token_ids == expected
        assert eng.stats()["remote"]["rejected"] == 1
        assert any("rejected" in rec.message and keys[1] in rec.message for rec in caplog.records)
        assert eng.tiers.flush(60)  # deleted, then the request's insert wrote it again: the tier heals
        healed = np.frombuffer(client.get(victim), dtype=np.uint8).copy()
        tier = eng.tiers.get("remote")
        assert isinstance(tier, BlockTier)
        expect = BlockMeta(keys[1], keys[0], tier.addresses.fingerprint, "float32", prompt[64:128])
        record = decode_record(healed, expect, tier._shapes, tier.codec.stored_dtype)
        assert isinstance(record, Block) and record.tokens == prompt[64:128]
    finally:
        eng.close()


class _VanishingStore(RedisStore):
    """A real store whose block ``victim`` is deleted right after a lookup found it."""

    victim = ""

    def exists(self, addresses):
        found = super().exists(addresses)
        self.client.delete(KEY_PREFIX + self.victim)
        return found


def test_a_block_that_vanishes_between_lookup_and_read_is_a_miss(loaded_model, prompt, url):
    _write(loaded_model, url, prompt)
    eng = _engine(loaded_model, url=url)
    try:
        remote = eng.tiers.get("remote")
        assert isinstance(remote, BlockTier)
        store = _VanishingStore(url, timeout_s=1.0)
        store.victim = _keys(eng, prompt)[1]
        tier = BlockTier(
            store,
            name="remote",
            fingerprint=remote.addresses.fingerprint,
            codec=remote.codec,
            kv_dtype="float32",
            geometry=remote.geometry,
            cache=eng.cache,
            log=logging.getLogger(LOGGER),
        )
        try:
            buffer = eng.runner.new_buffer(len(prompt))
            assert tier.extend(buffer, prompt, eng._namespace(""), limit=len(prompt) - 1) == BLOCK_TOKENS
            assert tier.stats()["rejected"] == 0 and buffer.length == BLOCK_TOKENS
        finally:
            tier.close()
    finally:
        eng.close()


def test_redis_eviction_bounds_the_tier(loaded_model, off, url, client):
    maxmemory = 8 << 20  # two float32 blocks (2.9 MB each) and change; the prompts write four
    client.config_set("maxmemory", str(maxmemory))
    evicted_before = client.info("stats")["evicted_keys"]
    prompts = [real_text_ids(loaded_model.tokenizer, 2 * BLOCK_TOKENS + 2)[i:] for i in (0, 1)]
    try:
        eng = _engine(loaded_model, url=url)
        try:
            for ids in prompts:
                eng.generate(ids, GREEDY)
                assert eng.tiers.flush(60)
                assert client.info("memory")["used_memory"] <= maxmemory + (3 << 20)  # at most one value over
            assert eng.stats()["remote"]["write_errors"] == 0  # eviction made room every time
        finally:
            eng.close()
        assert client.info("stats")["evicted_keys"] > evicted_before
        reader = _engine(loaded_model, url=url)
        try:
            for ids in prompts:  # whatever survived is used, the rest computed: the same tokens
                assert reader.generate(ids, GREEDY).token_ids == off.generate(ids, GREEDY).token_ids
            assert reader.stats()["remote"]["rejected"] == 0
            client.config_set("maxmemory-policy", "noeviction")  # misconfigured: Redis refuses writes
            client.config_set("maxmemory", str(2 << 20))
            assert (
                reader.generate(prompts[0][1:], GREEDY).token_ids
                == off.generate(prompts[0][1:], GREEDY).token_ids
            )
            assert reader.tiers.flush(60) and reader.stats()["remote"]["write_errors"] >= 1
        finally:
            reader.close()
    finally:
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.config_set("maxmemory", "0")


def test_chunk_placements_are_shared_through_redis(loaded_model, url, tmp_path):
    """reuse="chunks": the placements replica A computed are read by replica B (another home) from
    Redis, not prefilled again, and B's stitched answer is A's."""
    from tests.engine.chunks.test_chunks_mode import rag_prompt

    options = {"reuse": "chunks", "chunk_recompute": "first"}
    first_ids, first_spans = rag_prompt(loaded_model.tokenizer, "abc")
    ids, spans = rag_prompt(loaded_model.tokenizer, "cab", "Who leads the team?")
    answers = []
    for home in ("a", "b"):
        eng = _engine(loaded_model, url=url, home=tmp_path / home, **options)
        try:
            if home == "a":  # computes the placements of b and c, and a's as the first chunk
                eng.generate(first_ids, GREEDY, namespace="t", chunk_spans=first_spans)
            answers.append(eng.generate(ids, GREEDY, namespace="t", chunk_spans=spans))
            assert eng.tiers.flush(60)
        finally:
            eng.close()
    a, b = answers
    assert b.stitched_tokens == a.stitched_tokens > 0
    assert b.chunk_prefill_tokens == 0  # every reused chunk's placement came from Redis
    assert b.token_ids == a.token_ids
