"""Pipeline: documents in, grounded answers out, with the prefix cache doing the heavy lifting.

question ─► KnowledgeBase.search_timed (hybrid retrieval, optional rerank)
         ─► PromptAssembler.assemble (stable prefix first; chunk order the cache holds longest)
         ─► engine.stream(token_ids, namespace=tenant, reuse=..., chunk_spans=..., chunk_context=...)
         ─► Answer(text, sources, usage, timings)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.backend import EventStream, GenerationBackend, cache_probe
from engine.chunks.reuse import REUSE_MODES
from engine.request import GenerationResult
from engine.sampling import SamplingParams
from rag.config import RAGConfig
from rag.ingestion.loaders import LoadResult
from rag.knowledge_base import KnowledgeBase
from rag.prompt.assembler import ChunkLike, Prompt, PromptAssembler, chat_question
from rag.prompt.order import CHUNKS_MODE_ORDER, PrefixProbe
from rag.prompt.public import public_prefix_length
from rag.query import Query, collection_names
from rag.results import Answer, Grounded, PipelineEvent, Source, Timings, Usage
from rag.types import DEFAULT_COLLECTION, Chunk, Document, DocumentInfo, ScoredChunk
from rag.warming import WarmReport, warm_chunks


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
        if knowledge_base is None:  # the store's ingest-time settings, where it holds documents
            knowledge_base = KnowledgeBase(self.config)
            self.config = knowledge_base.config
        self.kb = knowledge_base
        self._engine = engine
        self._assembler: PromptAssembler | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: RAGConfig, *, engine: GenerationBackend | None = None) -> Pipeline:
        """A pipeline on the store ``config`` names (``document_store``, else ``index_dir``, which it
        loads when it holds an index and saves every change to; else in memory)."""
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
                self._assembler = build_assembler(self.config, engine.tokenizer, engine.max_context)
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
        selected = None if collections is None else collection_names(collections)
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

    def close(self) -> None:
        """Let go of the document store (a local directory's writer lock, a database's connections)."""
        self.kb.close()

    # ---- questions ----------------------------------------------------------------------------
    def retrieve(
        self, question: str, top_k: int | None = None, *, collections: Iterable[str] | None = None
    ) -> list[ScoredChunk]:
        """The chunks of ``collections`` (default: all) an answer would be grounded on, best first
        (``top_k`` defaults to the config's)."""
        return self.kb.run(self._query(question, top_k, collections)).hits

    def assemble(self, question: str, chunks: Sequence[ScoredChunk], namespace: str = "") -> Prompt:
        """The prompt (token ids + segments) the engine would get for these chunks."""
        return self.assembler.assemble(question, chunks, prefix_probe=self._probe(namespace))

    def assemble_messages(self, messages: Sequence[Mapping[str, str]]) -> Prompt:
        """Segment-wise tokenized chat (turn N's ids prefix turn N+1's, so multi-turn chats hit)."""
        return self.assembler.assemble_messages(messages)

    def ground(
        self,
        question: str,
        top_k: int | None = None,
        namespace: str = "",
        *,
        collections: Iterable[str] | None = None,
    ) -> Grounded:
        """Everything before generation: retrieve for ``question`` from ``collections`` (default: all),
        assemble its prompt in ``namespace``'s chunk order, score its sources. ``stream_grounded``
        generates from it."""
        return self._ground_question(self._query(question, top_k, collections), namespace)

    def ground_chat(
        self,
        messages: Sequence[Mapping[str, str]],
        top_k: int | None = None,
        namespace: str = "",
        *,
        collections: Iterable[str] | None = None,
    ) -> Grounded:
        """``ground`` for a chat: its last user message is the question that retrieves, and the prompt
        is the chat with the chunks and that question in its last user message
        (``PromptAssembler.assemble_chat``: the layout, budget, chunk order and sources of ``ground``)."""
        started = time.perf_counter()
        query = self._query(chat_question(messages), top_k, collections)

        order = self._order(None)

        def assemble(hits: list[ScoredChunk], probe: PrefixProbe | None) -> Prompt:
            return self.assembler.assemble_chat(messages, hits, prefix_probe=probe, order=order)

        return self._ground(query, namespace, assemble, started)

    def stream_grounded(
        self, grounded: Grounded, params: SamplingParams | None = None, *, reuse: str | None = None
    ) -> EventStream:
        """The engine's stream for a grounded prompt, in the namespace it was grounded for (its chunk
        spans for ``reuse="chunks"``, its public prefix where sharing is on). ``close()`` cancels."""
        if reuse not in (None, *REUSE_MODES):
            raise ValueError(f"reuse must be one of {', '.join(REUSE_MODES)}, got {reuse!r}")
        prompt = grounded.prompt
        return self.engine.stream(
            prompt.token_ids,
            params or self.config.sampling_params(),
            namespace=grounded.namespace,
            public_prefix=self._public_tokens(prompt),
            reuse=reuse,
            **prompt.stitch_args(),
        )

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
        Retrieval reads only ``collections`` (default: all) and starts with the first ``next()``.

        ``params`` default to ``config.sampling_params()``; derive others from it
        (``config.sampling_params(max_tokens=...)``) to keep the pipeline's other settings.
        """
        query = self._query(question, top_k, collections)
        if reuse not in (None, *REUSE_MODES):
            raise ValueError(f"reuse must be one of {', '.join(REUSE_MODES)}, got {reuse!r}")
        return self._answer(lambda: self._ground_question(query, namespace, reuse), params, reuse)

    def _answer(
        self, ground: Callable[[], Grounded], params: SamplingParams | None, reuse: str | None
    ) -> Iterator[PipelineEvent]:
        grounded = ground()
        yield PipelineEvent("sources", sources=grounded.sources)
        result: GenerationResult | None = None
        first_token_ms = 0.0
        stream = self.stream_grounded(grounded, params, reuse=reuse)
        try:
            for event in stream:
                if event.ttft_s is not None:
                    first_token_ms = 1000 * (time.perf_counter() - grounded.started)
                if event.text:
                    yield PipelineEvent("delta", text=event.text)
                result = event.result or result
        finally:
            stream.close()  # cancels generation if our consumer went away
        assert result is not None
        timings = Timings(
            retrieve_ms=grounded.retrieve_ms,
            rerank_ms=grounded.rerank_ms,
            ttft_ms=first_token_ms,
            total_ms=1000 * (time.perf_counter() - grounded.started),
            assemble_ms=grounded.assemble_ms,
            prefill_ms=1000 * result.ttft_s,
        )
        answer = Answer(result.text, grounded.sources, Usage.of(result), timings, result.finish_reason)
        yield PipelineEvent("done", answer=answer)

    def _query(self, question: str, top_k: int | None, collections: Iterable[str] | None) -> Query:
        """The question checked once (its ``top_k``: the config's for None): everything below takes
        the Query as it is."""
        return Query.of(question, top_k, collections, default_top_k=self.config.top_k, name="question")

    def _ground_question(self, query: Query, namespace: str, reuse: str | None = None) -> Grounded:
        started = time.perf_counter()
        order = self._order(reuse)

        def assemble(hits: list[ScoredChunk], probe: PrefixProbe | None) -> Prompt:
            return self.assembler.assemble(query.text, hits, prefix_probe=probe, order=order)

        return self._ground(query, namespace, assemble, started)

    def _ground(
        self,
        query: Query,
        namespace: str,
        assemble: Callable[[list[ScoredChunk], PrefixProbe | None], Prompt],
        started: float,
    ) -> Grounded:
        """Retrieve (timed), ``assemble`` the hits in ``namespace``'s chunk order (timed), score the
        sources of the chunks the prompt holds."""
        found = self.kb.run(query)
        clock = time.perf_counter()
        prompt = assemble(found.hits, self._probe(namespace))
        assemble_ms = 1000 * (time.perf_counter() - clock)
        sources = self._sources(query, prompt.chunks)
        return Grounded(prompt, sources, namespace, started, found.retrieve_ms, found.rerank_ms, assemble_ms)

    def _order(self, reuse: str | None) -> str | None:
        """The chunk order for a request in ``reuse`` mode (None: the configured one). Chunks mode
        reuses a cached chunk wherever it stands: its order is the one answers are best in."""
        chunks = (reuse or self.config.engine.reuse) == "chunks" and self.engine.capabilities.chunk_reuse
        return CHUNKS_MODE_ORDER if chunks else None

    def _sources(self, query: Query, chunks: Sequence[ChunkLike]) -> list[Source]:
        ids = [c.chunk_id for c in chunks]
        similarity = self.kb.similarity(query, ids) if chunks else {}
        return [_source(c, similarity.get(c.chunk_id, 0.0)) for c in chunks]

    def _probe(self, namespace: str) -> PrefixProbe | None:
        """What the engine's cache holds of a candidate prompt, for the ``cache`` chunk order (None: the
        engine cannot say)."""
        cache = cache_probe(self.engine)
        if cache is None:
            return None
        if self._shares_public():
            return lambda ids: max(
                cache.cached_prefix_length(ids, namespace), cache.cached_prefix_length(ids, public=True)
            )
        return lambda ids: cache.cached_prefix_length(ids, namespace)

    def _shares_public(self) -> bool:
        """Public-prefix sharing is configured and the engine implements it."""
        return bool(self.config.public_collections) and self.engine.capabilities.public_prefix

    def _public_tokens(self, prompt: Prompt) -> int:
        """Leading tokens of ``prompt`` the engine may share across tenants (0: none)."""
        if not self._shares_public():
            return 0
        return public_prefix_length(prompt, set(self.config.public_collections))


def build_assembler(config: RAGConfig, tokenizer: Any, max_context: int | None) -> PromptAssembler:
    """The prompt assembler ``config`` describes, for a model with this tokenizer and context."""
    return PromptAssembler(
        tokenizer,
        system_prompt=config.system_prompt,
        tools=config.tools,
        pinned_context=config.pinned_context,
        order=config.chunk_order,
        max_context_tokens=max_context,
        max_tokens=config.max_tokens,
    )


def _source(chunk: Any, score: float) -> Source:
    return Source(
        doc_id=str(chunk.doc_id),
        chunk_id=str(chunk.chunk_id),
        score=float(score),
        text=str(chunk.text),
        metadata=dict(getattr(chunk, "metadata", {}) or {}),
        collection=str(getattr(chunk, "collection", DEFAULT_COLLECTION)),
    )
