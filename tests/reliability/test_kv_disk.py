"""The disk KV tier under real `prefixrag serve` processes: SIGKILL in a burst of writes, damaged and
foreign files, a full disk, two servers on one folder under concurrent load, tenants kept apart.

Every output is checked against the same server's cold output (a fresh ``cache_salt``: nothing reused,
the prompt computed as with caching off), with greedy decoding. Prompts are short and answers a few
tokens, so each test takes seconds beyond starting its servers.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.tiers.blockfile import TEMP_PREFIX
from rag.api import Settings
from tests.api.conftest import make_engine
from tests.api.helpers import metric_value, wait_until
from tests.engine.tiers.records import block_files
from tests.reliability import support

MAX_TOKENS = 3
ADMIN = "sk-admin-kv-0001"
KEYS = {"sk-alice-kv-0001": "alice", "sk-bob-kv-00001": "bob"}
FILLER = (
    "The harbour ledger lists every crate, its weight, the dock it left from and the day it sailed. "
    "Clerks copy each line twice and the harbour master signs the page at dusk. "
)


def _prompt(topic: int, words: int = 12) -> str:
    """~200 tokens (three whole 64-token blocks), distinct from the first token on."""
    return f"Ledger {topic}: " + FILLER * 4 + " ".join(f"w{topic}x{k}" for k in range(words))


def _env(folder: Path, **extra: str) -> dict[str, str]:
    return {
        "PREFIXRAG_ENGINE__DISK_CACHE_DIR": str(folder),
        "PREFIXRAG_ENGINE__DISK_CACHE_BYTES": str(1 << 30),
        "PREFIXRAG_ENGINE__CACHE_BYTES": str(256 << 20),
        "PREFIXRAG_WARM_UP": "false",
        **extra,
    }


def _complete(
    http: httpx.Client, prompt: str, *, salt: str | None = None, key: str | None = None
) -> tuple[str, int, int]:
    """(text, cached tokens, prompt tokens) of a greedy completion; fails on anything but a valid 200."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    if salt:
        body["cache_salt"] = salt
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    reply = http.post("/v1/completions", json=body, headers=headers)
    assert reply.status_code == 200, (reply.status_code, reply.text)
    text = support.check_completion(reply.json(), MAX_TOKENS)
    usage = reply.json()["usage"]
    return text, usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"]


def _cold(http: httpx.Client, prompt: str, key: str | None = None) -> str:
    text, cached, _ = _complete(http, prompt, salt=f"cold-{uuid.uuid4().hex}", key=key)
    assert cached == 0
    return text


def _disk(http: httpx.Client, key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    disk = http.get("/v1/cache", headers=headers).json()["disk"]
    assert disk is not None, "the disk tier is off"
    return disk


def _settled(http: httpx.Client, key: str | None = None) -> bool:
    return _disk(http, key)["queue_depth"] == 0


def _block_files(folder: Path) -> list[Path]:
    """Files holding KV (links, which name a block by its first token, are left out)."""
    return block_files(folder)


# ---- SIGKILL during a burst of disk writes ---------------------------------------------------------


@pytest.mark.slow
def test_sigkill_during_a_burst_of_disk_writes_never_serves_a_torn_block(tmp_path):
    folder = tmp_path / "kv"
    prompts = [_prompt(t) for t in range(6)]
    server = support.ServerProcess(tmp_path, env=_env(folder, PREFIXRAG_MAX_INFLIGHT="16"))
    with server:
        sent: list[int] = []

        def client(part: list[int]) -> None:
            with httpx.Client(base_url=server.url, timeout=120) as http:
                for i in part:
                    sent.append(i)
                    try:
                        http.post("/v1/completions", json={"prompt": prompts[i], "max_tokens": 1})
                    except httpx.TransportError:
                        return  # killed

        threads = [threading.Thread(target=client, args=(list(range(n, len(prompts), 3)),)) for n in range(3)]
        for t in threads:
            t.start()
        with httpx.Client(base_url=server.url, timeout=10) as http:
            assert wait_until(lambda: _disk(http)["written_blocks"] >= 4, timeout=180, interval=0.02)
        server.kill()  # mid-burst: the writer is between blocks or inside one
        for t in threads:
            t.join(60)
    on_disk = _block_files(folder)
    torn = list(folder.rglob(f"{TEMP_PREFIX}*"))  # blocks the kill cut short: never renamed into place
    assert on_disk, "nothing was written before the kill"

    restarted = support.ServerProcess(tmp_path, env=_env(folder))
    with restarted, httpx.Client(base_url=restarted.url, timeout=120) as http:
        assert not [p for p in folder.rglob(f"{TEMP_PREFIX}*")]  # the killed writer's leftovers are gone
        hits = 0
        for prompt in prompts:
            text, cached, _ = _complete(http, prompt)
            assert text == _cold(http, prompt), prompt[:20]
            hits += cached >= 64
        disk = _disk(http)
        print(
            f"killed after {len(sent)} requests sent, with {len(on_disk)} block files and {len(torn)} temp "
            f"files on disk; restart: {hits}/{len(prompts)} prompts reused disk blocks, disk stats {disk}"
        )
        # every prompt starts "Ledger ": another may reuse those few tokens through the link at the root
        assert hits >= 1 and disk["hit_requests"] >= hits and disk["hit_tokens"] >= 64
        assert disk["rejected"] == 0  # no torn or damaged block was found, let alone served
        assert wait_until(lambda: _settled(http), timeout=60)
        assert _disk(http)["written_blocks"] >= 1  # and the tier keeps writing
    # each prompt, plain and cold-salted: three whole blocks and the partial one after them
    assert len(_block_files(folder)) == 2 * 4 * len(prompts)


# ---- damaged, foreign and unwritable files ---------------------------------------------------------


def _keyed_env(folder: Path) -> dict[str, str]:
    return {**_env(folder, PREFIXRAG_API_KEYS=json.dumps(KEYS)), "PREFIXRAG_ADMIN_KEY": ADMIN}


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    """One server with tenant keys, an admin key (to empty the RAM tier) and a disk tier; the last test
    starts a second server on its folder."""
    workdir = tmp_path_factory.mktemp("kv-server")
    folder = workdir / "kv"
    server = support.ServerProcess(workdir, env=_keyed_env(folder)).start()
    yield server, folder
    server.stop()


ALICE, BOB = list(KEYS)


def _forget_ram(http: httpx.Client) -> None:
    reply = http.post("/v1/cache/reset", headers={"Authorization": f"Bearer {ADMIN}"})
    assert reply.status_code == 200, reply.text


def _foreign_block(loaded_model, tmp_path: Path, prompt: str) -> Path:
    """A block file another model (another id and fingerprint) wrote for the same text."""
    folder = tmp_path / "foreign"
    config = EngineConfig(disk_cache_dir=folder, disk_cache_bytes=1 << 30)
    eng = Engine(loaded_model.model, loaded_model.tokenizer, model_id="another-model", config=config)
    try:
        eng.generate(prompt, SamplingParams(max_tokens=1))
        assert eng.disk is not None and eng.disk.flush(60)
    finally:
        eng.close()
    return _block_files(folder)[0]


@pytest.mark.slow
def test_damaged_and_foreign_blocks_are_misses_with_a_log_line_never_errors(
    keyed_server, loaded_model, tmp_path
):
    server, folder = keyed_server
    with httpx.Client(base_url=server.url, timeout=120) as http:
        cases = ["flipped byte", "truncated", "another model's file", "garbage"]
        prompts = {how: _prompt(100 + n) for n, how in enumerate(cases)}
        expected = {how: _cold(http, p, ALICE) for how, p in prompts.items()}
        for prompt in prompts.values():
            _complete(http, prompt, key=ALICE)
        assert wait_until(lambda: _settled(http, ALICE), timeout=60)
        foreign = _foreign_block(loaded_model, tmp_path, prompts["another model's file"])
        rejected_before = _disk(http, ALICE)["rejected"]
        for how, prompt in prompts.items():
            victims = _files_of(http, folder, prompt)
            _damage(victims, how, foreign)
        _forget_ram(http)
        for how, prompt in prompts.items():
            text, cached, _ = _complete(http, prompt, key=ALICE)
            assert text == expected[how], how
            assert cached < 192, how  # the damaged block and the ones after it were not used
        assert _disk(http, ALICE)["rejected"] - rejected_before == len(cases)
    log = server.log_path.read_text(errors="replace")
    assert log.count("rejected") >= len(cases), log[-3000:]
    for reason in ("checksum", "payload is", "another", "not a prefixrag KV block file"):
        assert reason in log, reason


def _files_of(http: httpx.Client, folder: Path, prompt: str) -> list[Path]:
    """The block files a prompt's RAM-cached KV was written to: the ones its request touches.

    Its answer's own blocks are written behind the reply, new files, whenever the writer gets to them:
    only files there before count, and the writer is idle when they are read."""
    _forget_ram(http)
    assert wait_until(lambda: _settled(http, ALICE), timeout=60)
    stamps = {p: p.stat().st_mtime_ns for p in _block_files(folder)}
    time.sleep(0.01)
    _complete(http, prompt, key=ALICE)  # a disk hit: every block it reads is touched
    assert wait_until(lambda: _settled(http, ALICE), timeout=60)
    touched = [p for p in _block_files(folder) if p in stamps and p.stat().st_mtime_ns != stamps[p]]
    assert len(touched) == 4, touched  # three whole blocks and the partial one after them
    return sorted(touched, key=lambda p: -p.stat().st_mtime_ns)  # block 0 first (deeper blocks are older)


def _damage(files: list[Path], how: str, foreign: Path) -> None:
    victim = files[1]  # the middle block: block 0 still loads
    data = bytearray(victim.read_bytes())
    if how == "flipped byte":
        data[len(data) // 2] ^= 0x20
        victim.write_bytes(bytes(data))
    elif how == "truncated":
        victim.write_bytes(bytes(data[:1000]))
    elif how == "garbage":
        victim.write_bytes(b"\x00" * 4096)
    else:
        shutil.copyfile(foreign, victim)


@pytest.mark.slow
def test_tenants_never_read_each_others_blocks_from_disk(keyed_server):
    server, _ = keyed_server
    prompt = _prompt(200)
    with httpx.Client(base_url=server.url, timeout=120) as http:
        expected = _cold(http, prompt, ALICE)
        _complete(http, prompt, key=ALICE)
        assert wait_until(lambda: _settled(http, ALICE), timeout=60)
        _forget_ram(http)
        text_b, cached_b, n = _complete(http, prompt, key=BOB)
        assert cached_b == 0 and text_b == expected  # bob computes it himself
        hits_before = _disk(http, ALICE)["hit_tokens"]
        text_a, cached_a, _ = _complete(http, prompt, key=ALICE)
        assert cached_a == n - 1 and text_a == expected  # alice's blocks were there all along
        assert _disk(http, ALICE)["hit_tokens"] - hits_before == n - 1


@pytest.mark.slow
def test_warming_through_the_api_writes_blocks_a_restart_reads(keyed_server):
    server, _ = keyed_server
    prompt = _prompt(300)
    with httpx.Client(base_url=server.url, timeout=120) as http:
        denied = http.post(
            "/v1/cache/warm", json={"prompts": [prompt]}, headers={"Authorization": f"Bearer {ALICE}"}
        )
        assert denied.status_code == 403
        reply = http.post(
            "/v1/cache/warm",
            json={"prompts": [prompt], "tenant": "alice"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["disk_written"] is True and reply.json()["prompt_tokens"] > 192
        _forget_ram(http)
        _, cached, n = _complete(http, prompt, key=ALICE)
        assert cached == n - 1


def test_a_full_disk_is_a_log_line_never_an_error(serve, loaded_model, small_tmpfs, caplog):
    """The folder on a 64 KiB tmpfs: no block file fits, every write fails with ENOSPC."""
    eng = make_engine(loaded_model, disk_cache_dir=small_tmpfs)
    try:
        with (
            serve(Settings(), engine=eng) as srv,
            httpx.Client(base_url=srv.url, timeout=120) as http,
            caplog.at_level(logging.WARNING, logger="engine.tiers.disk"),
        ):
            for n in range(2):
                prompt = _prompt(400 + n)
                text, _, _ = _complete(http, prompt)
                assert text == _cold(http, prompt)
            assert wait_until(lambda: _settled(http), timeout=60)
            disk = _disk(http)
            assert disk["write_errors"] >= 2 and disk["written_blocks"] == 0
            metrics = http.get("/metrics").text
            assert metric_value(metrics, "prefixrag_kv_disk_write_errors_total") == disk["write_errors"]
        assert any("cannot write" in rec.message and "No space left" in rec.message for rec in caplog.records)
    finally:
        eng.close()


# ---- two servers on one folder ---------------------------------------------------------------------


@pytest.mark.slow
def test_two_servers_sharing_a_folder_under_concurrent_load(keyed_server):
    """The module's keyed server and a second one started on its folder, with the same keys."""
    first, folder = keyed_server
    second = support.ServerProcess(first.workdir, env=_keyed_env(folder), index=first.workdir / "index-2")
    servers = [first, second.start()]
    try:
        stems = [_prompt(500 + s, words=0) for s in range(2)]
        prompts = [f"{stem} Question {q}: which dock?" for stem in stems for q in range(2)]
        clients = [httpx.Client(base_url=s.url, timeout=120) for s in servers]
        rejected_before = [_disk(http, ALICE)["rejected"] for http in clients]  # earlier tests damaged some
        expected = {p: _cold(clients[0], p, ALICE) for p in prompts}
        rng = random.Random(3)
        jobs = [(rng.randrange(2), p) for p in prompts * 2]
        rng.shuffle(jobs)
        outcomes: list[tuple[str, str, str]] = []

        def worker(part: list[tuple[int, str]]) -> None:
            mine = [httpx.Client(base_url=s.url, timeout=120) for s in servers]
            for which, prompt in part:
                text, _, _ = _complete(mine[which], prompt, key=ALICE)
                outcomes.append((prompt, text, expected[prompt]))
            for http in mine:
                http.close()

        threads = [threading.Thread(target=worker, args=(jobs[n::4],)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert len(outcomes) == len(jobs)
        assert all(got == want for _, got, want in outcomes), [o[0][:30] for o in outcomes if o[1] != o[2]]

        # a prefix one server wrote is read by the other, which never computed it
        fresh = _prompt(600)
        reference = _cold(clients[1], fresh, ALICE)
        _complete(clients[0], fresh, key=ALICE)
        assert wait_until(lambda: _settled(clients[0], ALICE), timeout=60)
        text, cached, n = _complete(clients[1], fresh, key=ALICE)
        assert cached == n - 1 and text == reference
        for http, before in zip(clients, rejected_before):
            assert _disk(http, ALICE)["rejected"] == before
            http.close()
    finally:
        second.stop()
