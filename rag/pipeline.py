"""Pipeline: documents in, grounded answers out, with the prefix cache doing the heavy lifting.

question ─► KnowledgeBase.search_timed (hybrid retrieval, optional rerank)
         ─► PromptAssembler.assemble (stable prefix first; chunk order the cache holds longest)
         ─► engine.stream(token_ids, namespace=tenant, reuse=..., chunk_spans=...)
         ─► Answer(text, sources, usage, timings)
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from engine.chunks.reuse import REUSE_MODES
from engine.request import GenerationResult, StreamEvent
from engine.sampling import SamplingParams
from rag.config import RAGConfig
from rag.ingestion.collection import DocumentInfo
from rag.ingestion.loaders import LoadResult
from rag.knowledge_base import KnowledgeBase
from rag.prompt.assembler import ChunkLike, Prompt, PromptAssembler
from rag.prompt.public import public_prefix_length
from rag.types import DEFAULT_COLLECTION, Chunk, Document, ScoredChunk, check_collection
from rag.warming import WarmReport, warm_chunks


class GenerationBackend(Protocol):
    """What the pipeline needs from an engine: ``engine.Engine`` and ``engine.RemoteEngine`` fit."""

    model_id: str
    tokenizer: Any

    def stream(
        self,
        prompt: Any,
        params: SamplingParams | None = None,
        *,
        namespace: str = "",
        reuse: Any = None,
        chunk_spans: Sequence[tuple[int, int]] | None = None,
    ) -> Iterator[StreamEvent]: ...


@dataclass(frozen=True)
class Source:
    """A chunk the answer may cite: ``[n]`` in the text refers to ``sources[n - 1]``.

    ``score`` is the cosine similarity of the question's and the chunk's embeddings, in [-1, 1] (higher
    is closer): the same measure whatever retrieval mode, fusion or reranker picked the chunk and
    however many candidates there were. Sources are listed in prompt order, not by score.
    """

    doc_id: str
    chunk_id: str
    score: float
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    collection: str = DEFAULT_COLLECTION


@dataclass(frozen=True)
class Usage:
    """Token counts. ``cached_tokens``: the exact prefix reused; ``stitched_tokens``: prompt tokens whose
    KV came from cached chunks at other positions (``reuse="chunks"``), of which ``recomputed_tokens``
    were computed again so the chunks see each other; ``reuse``: the mode that served the request;
    ``stitch_deviation``: the engine's estimate of how far a stitched prompt was from exact, 0 to 1
    (the share of the question's attention on chunk KV left stitched; None when nothing was)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    stitched_tokens: int = 0
    recomputed_tokens: int = 0
    reuse: str = "prefix"
    stitch_deviation: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    """Milliseconds (every field; the engine's ``GenerationResult`` reports seconds, ``*_s``).

    ``ttft_ms``: from the question to the first answer token (retrieval included); ``prefill_ms``: the
    engine's share of it (queue + prefill of the uncached suffix)."""

    retrieve_ms: float
    rerank_ms: float
    ttft_ms: float
    total_ms: float
    assemble_ms: float = 0.0
    prefill_ms: float = 0.0


@dataclass(frozen=True)
class Answer:
    """A grounded answer with its citations, token usage and where the time went."""

    text: str
    sources: list[Source]
    usage: Usage
    timings: Timings
    finish_reason: str = "stop"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PipelineEvent:
    """One step of ``Pipeline.stream``: ``sources`` first, then ``delta`` text, then ``done`` (answer)."""

    type: Literal["sources", "delta", "done"]
    text: str = ""
    sources: list[Source] | None = None
    answer: Answer | None = None


class Pipeline:
    """Retrieval-augmented QA over your documents, built around prefix KV-cache reuse.

    Example:
        >>> p = Pipeline()                                      # bundled models, in-memory index
        >>> p.add_documents([Document(id="a", text="The Zorblax code is 4417.")])
        ['a']
        >>> ans = p.ask("What is the Zorblax code?")
        >>> ans.text, ans.sources[0].doc_id, ans.usage.cached_tokens     # doctest: +SKIP
        ('The Zorblax code is 4417 [1].', 'a', 0)
        >>> for ev in p.stream("And again?"):                   # sources, deltas, done
        ...     print(ev.text, end="")
    """

    def __init__(
        self,
        config: RAGConfig | None = None,
        *,
        engine: GenerationBackend | None = None,
        knowledge_base: KnowledgeBase | None = None,
    ) -> None:
        self.config = config or RAGConfig()
        self.kb = knowledge_base or KnowledgeBase(self.config)
        self._engine = engine
        self._assembler: PromptAssembler | None = None
        self._engine_shares: bool | None = None  # whether the engine takes public_prefix
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: RAGConfig, *, engine: GenerationBackend | None = None) -> Pipeline:
        """A pipeline for ``config``; loads the saved index when ``config.index_dir`` holds one."""
        if config.index_dir is not None and _has_index(config.index_dir):
            return cls.load(config.index_dir, config=config, engine=engine)
        return cls(config, engine=engine)

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike[str],
        *,
        config: RAGConfig | None = None,
        engine: GenerationBackend | None = None,
    ) -> Pipeline:
        """Open an index written by ``save`` (the saved config unless one is given)."""
        kb = KnowledgeBase.load(directory, config)
        return cls(kb.config, engine=engine, knowledge_base=kb)

    # ---- components ---------------------------------------------------------------------------
    @property
    def engine(self) -> GenerationBackend:
        """The generation engine (loaded on first use from ``config.engine``)."""
        with self._lock:
            return self._engine_unlocked()

    @property
    def assembler(self) -> PromptAssembler:
        with self._lock:
            if self._assembler is None:
                engine = self._engine_unlocked()
                cfg = self.config
                self._assembler = PromptAssembler(
                    engine.tokenizer,
                    system_prompt=cfg.system_prompt,
                    tools=cfg.tools,
                    pinned_context=cfg.pinned_context,
                    order=cfg.chunk_order,
                    max_context_tokens=getattr(engine, "max_context", None),
                    max_tokens=cfg.max_tokens,
                )
            return self._assembler

    def _engine_unlocked(self) -> GenerationBackend:
        if self._engine is None:
            from engine.engine import Engine

            self._engine = Engine.from_config(self.config.engine)
        return self._engine

    def warm_up(self) -> None:
        """Load every model now (embedder, tokenizer, LLM) instead of on the first request."""
        self.kb.warm_up()
        _ = self.assembler

    def warm(
        self,
        namespace: str = "",
        *,
        show_progress: bool = False,
        cancel: threading.Event | None = None,
        progress: Any = None,
        collections: Iterable[str] | None = None,
    ) -> WarmReport:
        """Prefill every chunk of ``collections`` (default: all) at its placement in the engine's cache
        for ``namespace`` (``rag.warming``): resumable, cancellable through ``cancel``, within the cache
        budget (``report.not_fitted`` lists the rest)."""
        selected = None if collections is None else _names(collections)
        chunks = [
            ScoredChunk.of(c, 0.0)
            for info in self.kb.list_documents(selected)
            for c in self.kb.chunks_of(info.id, info.collection)
        ]
        return warm_chunks(
            self.engine,
            self.assembler,
            chunks,
            namespace,
            show_progress=show_progress,
            cancel=cancel,
            progress=progress,
        )

    # ---- documents ----------------------------------------------------------------------------
    def add_documents(
        self, docs: Iterable[Document], *, collection: str = DEFAULT_COLLECTION, show_progress: bool = False
    ) -> list[str]:
        """Add or update documents in ``collection`` (unchanged ones are a no-op); returns their ids."""
        return self.kb.add_documents(docs, collection=collection, show_progress=show_progress)

    def ingest(
        self,
        paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
        *,
        collection: str = DEFAULT_COLLECTION,
        show_progress: bool = False,
    ) -> LoadResult:
        """Load .txt/.md/.html/.pdf files and folders into ``collection``; ``.skipped`` says what was
        left out and why."""
        return self.kb.ingest(paths, collection=collection, show_progress=show_progress)

    def delete_document(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> bool:
        """Remove a document of ``collection``; False if it holds no such id."""
        return self.kb.delete_document(doc_id, collection)

    def get_document(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> Document | None:
        return self.kb.get_document(doc_id, collection)

    def list_documents(self, collections: Iterable[str] | None = None) -> list[DocumentInfo]:
        """The documents of ``collections`` (default: all)."""
        return self.kb.list_documents(collections)

    def chunks_of(self, doc_id: str, collection: str = DEFAULT_COLLECTION) -> list[Chunk]:
        return self.kb.chunks_of(doc_id, collection)

    def collections(self) -> list[str]:
        """Names of the collections holding documents."""
        return self.kb.collections()

    def count_documents(self, collections: Iterable[str] | None = None) -> int:
        """Documents in ``collections`` (default: all)."""
        return self.kb.count(collections)

    def save(self, directory: str | os.PathLike[str] | None = None) -> Path:
        """Write the index atomically (a crash mid-save leaves the previous one loadable)."""
        return self.kb.save(directory)

    # ---- questions ----------------------------------------------------------------------------
    def retrieve(
        self, question: str, top_k: int | None = None, *, collections: Iterable[str] | None = None
    ) -> list[ScoredChunk]:
        """The chunks of ``collections`` (default: all) an answer would be grounded on, best first
        (``top_k`` defaults to the config's)."""
        top_k = self.config.resolve_top_k(top_k)
        return self.kb.search(question, top_k, collections=collections) if self.kb.count(collections) else []

    def assemble(self, question: str, chunks: Sequence[ScoredChunk], namespace: str = "") -> Prompt:
        """The prompt (token ids + segments) the engine would get for these chunks."""
        return self.assembler.assemble(question, chunks, prefix_probe=self._probe(namespace))

    def assemble_messages(self, messages: Sequence[Mapping[str, str]]) -> Prompt:
        """Segment-wise tokenized chat (turn N's ids prefix turn N+1's, so multi-turn chats hit)."""
        return self.assembler.assemble_messages(messages)

    def ask(
        self,
        question: str,
        top_k: int | None = None,
        namespace: str = "",
        *,
        params: SamplingParams | None = None,
        collections: Iterable[str] | None = None,
        reuse: str | None = None,
    ) -> Answer:
        """Answer a question from the documents of ``collections`` (default: all). ``reuse``: the
        engine's KV reuse mode for this request (None: the engine's own; ``"chunks"`` also reuses
        cached chunks out of prefix order)."""
        answer = None
        for event in self.stream(
            question, top_k, namespace, params=params, collections=collections, reuse=reuse
        ):
            answer = event.answer or answer
        assert answer is not None
        return answer

    def stream(
        self,
        question: str,
        top_k: int | None = None,
        namespace: str = "",
        *,
        params: SamplingParams | None = None,
        collections: Iterable[str] | None = None,
        reuse: str | None = None,
    ) -> Iterator[PipelineEvent]:
        """Yield the sources, then text deltas, then the full Answer. Closing early cancels generation.
        Retrieval reads only ``collections`` (default: all).

        ``params`` default to ``config.sampling_params()``; derive others from it
        (``config.sampling_params(max_tokens=...)``) to keep the pipeline's other settings.
        """
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty string, got {question!r}")
        top_k = self.config.resolve_top_k(top_k)
        if reuse not in (None, *REUSE_MODES):
            raise ValueError(f"reuse must be one of {', '.join(REUSE_MODES)}, got {reuse!r}")
        selected = None if collections is None else _names(collections)
        return self._stream(
            question, top_k, namespace, params or self.config.sampling_params(), selected, reuse
        )

    def _stream(
        self,
        question: str,
        top_k: int,
        namespace: str,
        params: SamplingParams,
        collections: list[str] | None,
        reuse: str | None,
    ) -> Iterator[PipelineEvent]:
        t0 = time.perf_counter()
        if self.kb.count(collections):
            found = self.kb.search_timed(question, top_k, collections=collections)
            hits, retrieve_ms, rerank_ms = found.hits, found.retrieve_ms, found.rerank_ms
        else:
            hits, retrieve_ms, rerank_ms = [], 0.0, 0.0
        t1 = time.perf_counter()
        prompt = self.assemble(question, hits, namespace)
        assemble_ms = 1000 * (time.perf_counter() - t1)
        sources = self._sources(question, prompt.chunks, collections)
        yield PipelineEvent("sources", sources=sources)
        result: GenerationResult | None = None
        first_token_ms = 0.0
        public = self._public_tokens(prompt)
        shared = {"public_prefix": public} if public else {}
        stream = self.engine.stream(
            prompt.token_ids,
            params,
            namespace=namespace,
            reuse=reuse,
            chunk_spans=prompt.chunk_spans,
            **shared,
        )
        try:
            for event in stream:
                if event.ttft_s is not None:
                    first_token_ms = 1000 * (time.perf_counter() - t0)
                if event.text:
                    yield PipelineEvent("delta", text=event.text)
                result = event.result or result
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()  # cancels generation if our consumer went away
        assert result is not None
        timings = Timings(
            retrieve_ms=retrieve_ms,
            rerank_ms=rerank_ms,
            ttft_ms=first_token_ms,
            total_ms=1000 * (time.perf_counter() - t0),
            assemble_ms=assemble_ms,
            prefill_ms=1000 * result.ttft_s,
        )
        usage = Usage(
            result.prompt_tokens,
            result.cached_tokens,
            result.completion_tokens,
            result.stitched_tokens,
            result.recomputed_tokens,
            result.reuse,
            result.stitch_deviation,
        )
        answer = Answer(result.text, sources, usage, timings, result.finish_reason)
        yield PipelineEvent("done", answer=answer)

    def _sources(
        self, question: str, chunks: Sequence[ChunkLike], collections: list[str] | None
    ) -> list[Source]:
        ids = [c.chunk_id for c in chunks]
        similarity = self.kb.similarity(question, ids, collections=collections) if chunks else {}
        return [_source(c, similarity.get(c.chunk_id, 0.0)) for c in chunks]

    def _probe(self, namespace: str) -> Any:
        probe = getattr(self.engine, "cached_prefix_length", None)
        if probe is None:
            return None
        if self._shares_public():
            return lambda ids: max(probe(ids, namespace), probe(ids, public=True))
        return lambda ids: probe(ids, namespace)

    def _shares_public(self) -> bool:
        """Public-prefix sharing is configured and the engine implements it."""
        if not self.config.public_collections:
            return False
        if self._engine_shares is None:
            self._engine_shares = "public_prefix" in inspect.signature(self.engine.stream).parameters
        return self._engine_shares

    def _public_tokens(self, prompt: Prompt) -> int:
        """Leading tokens of ``prompt`` the engine may share across tenants (0: none)."""
        if not self._shares_public():
            return 0
        return public_prefix_length(prompt, set(self.config.public_collections))


def _source(chunk: Any, score: float) -> Source:
    return Source(
        doc_id=str(chunk.doc_id),
        chunk_id=str(chunk.chunk_id),
        score=float(score),
        text=str(chunk.text),
        metadata=dict(getattr(chunk, "metadata", {}) or {}),
        collection=str(getattr(chunk, "collection", DEFAULT_COLLECTION)),
    )


def _names(collections: Iterable[str]) -> list[str]:
    """Validated collection names (a bare string is refused: it would be read letter by letter)."""
    if isinstance(collections, str):
        raise ValueError(f"collections must be a list of names, got the string {collections!r}")
    return [check_collection(name) for name in collections]


def _has_index(directory: str | os.PathLike[str]) -> bool:
    from rag.ingestion.persist import current_version

    try:
        current_version(Path(directory).expanduser())
    except (FileNotFoundError, ValueError):
        return False
    return True
