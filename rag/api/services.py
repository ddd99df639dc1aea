"""Services: what the routers work with (engine, pipeline, key ring, metrics, limits), built once per app.

The engine (and pipeline) are either injected (tests, embedding apps) or built from the settings in a
background thread at startup, so the server answers /healthz at once and /readyz turns 200 when the
model is loaded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Literal

import anyio

from engine import Engine
from engine.backend import GenerationBackend
from rag.api.auth import KeyRing
from rag.api.errors import ServiceUnavailable
from rag.api.limits import Admission
from rag.api.metrics import Metrics
from rag.api.settings import Settings
from rag.pipeline import Pipeline
from rag.prompt.assembler import PromptAssembler

log = logging.getLogger(__name__)

State = Literal["loading", "ready", "failed"]


class Services:
    """Shared state of one app instance.

    Example:
        >>> services = Services(Settings(), engine=my_engine)     # doctest: +SKIP
        >>> services.ready_engine().model_id                       # doctest: +SKIP
        'smollm2-135m-instruct'
    """

    def __init__(
        self,
        settings: Settings,
        *,
        engine: GenerationBackend | None = None,
        pipeline: Pipeline | None = None,
        engine_factory: Callable[[], GenerationBackend] | None = None,
        pipeline_factory: Callable[[GenerationBackend], Pipeline] | None = None,
    ) -> None:
        self.settings = settings
        self.started_at = int(time.time())
        self.keys = KeyRing(
            settings.api_keys,
            admin_key=settings.admin_key.get_secret_value() if settings.admin_key else None,
            admin_tenant=settings.admin_tenant,
        )
        self.pipeline = pipeline
        self._owns_pipeline = pipeline is None
        self.engine = engine if engine is not None or pipeline is None else pipeline.engine
        self._owns_engine = self.engine is None
        self._engine_factory: Callable[[], GenerationBackend] = engine_factory or (
            lambda: Engine.from_config(settings.engine)
        )
        self._pipeline_factory = pipeline_factory or (lambda engine: build_pipeline(settings, engine))
        self.admission = Admission(settings.max_inflight, retry_after_s=settings.retry_after_s)
        self.metrics = Metrics(engine_stats=self._engine_stats)
        self.metrics.in_flight.set_function(lambda: self.admission.in_flight)
        # worker threads for blocking engine / pipeline calls; admission keeps their number bounded
        self.limiter = anyio.CapacityLimiter(settings.max_inflight + 8)
        self.write_lock = threading.Lock()  # document writes and index saves, one at a time
        self.error: str | None = None
        self._loaded = threading.Event()
        if self.engine is not None and self.pipeline is not None:
            self._loaded.set()
        self._loader: threading.Thread | None = None
        self._assembler: Any = None  # chat messages -> Prompt; False when none applies
        self.warm_job: Any = None  # the latest rag.api.warm_job.WarmJob

    # ---- lifecycle ------------------------------------------------------------------------------
    @property
    def state(self) -> State:
        if self.error is not None:
            return "failed"
        return "ready" if self._loaded.is_set() else "loading"

    def start(self) -> None:
        """Load whatever was not injected, in a background thread (idempotent)."""
        if self._loaded.is_set() or self._loader is not None:
            return
        self._loader = threading.Thread(target=self._load, name="prefixrag-loader", daemon=True)
        self._loader.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._loaded.wait(timeout)

    def close(self) -> None:
        if self.warm_job is not None:
            self.warm_job.stop()
        if self._loader is not None:
            self._loader.join(timeout=300)
        if self._owns_engine and self.engine is not None:
            self.engine.close()
        if self._owns_pipeline and self.pipeline is not None:
            self.pipeline.close()

    def _load(self) -> None:
        try:
            if self.engine is None:
                log.info("loading model %s", self.settings.engine.model)
                self.engine = self._engine_factory()
            if self.pipeline is None:
                self.pipeline = self._pipeline_factory(self.engine)
            self._loaded.set()
            log.info("ready: %s", self.engine.model_id)
        except Exception as exc:  # reported by /readyz; requests get 503
            log.exception("loading failed")
            self.error = f"{type(exc).__name__}: {exc}"

    # ---- accessors routers use ----------------------------------------------------------------
    def ready_engine(self) -> GenerationBackend:
        """The engine, once loaded (an injected one at once; the pipeline may still be loading)."""
        engine = self.engine
        if engine is not None:
            return engine
        if self.error is not None:
            raise ServiceUnavailable(f"the model failed to load: {self.error}", retry_after_s=None)
        raise ServiceUnavailable("the model is still loading; retry shortly")

    def ready_pipeline(self) -> Pipeline:
        pipeline = self.pipeline
        if pipeline is not None:
            return pipeline
        if self.error is not None:
            raise ServiceUnavailable(f"the pipeline failed to load: {self.error}", retry_after_s=None)
        raise ServiceUnavailable("the document pipeline is still loading; retry shortly")

    def chat_prompt(self, messages: list[dict[str, str]]) -> Any:
        """Token ids for chat messages, tokenized message by message (the pipeline's assembler, or one
        over the engine's tokenizer) so each turn's ids are a prefix of the next turn's and multi-turn
        chats hit the cache; the messages themselves when no assembler applies."""
        assemble = self._chat_assembler()
        if assemble is None:
            return messages
        try:
            return list(assemble(messages).token_ids)
        except ValueError:  # e.g. over the context: the engine's own check gives the clear message
            return messages

    def _chat_assembler(self) -> Any:
        if self._assembler is None:
            if self.pipeline is not None:
                self._assembler = self.pipeline.assemble_messages
            else:
                self._assembler = _engine_assembler(self.ready_engine()) or False
        return self._assembler or None

    def store_status(self) -> dict[str, Any] | None:
        """Where the documents are and whether that store answers now (None: no pipeline yet)."""
        pipeline = self.pipeline
        if not isinstance(pipeline, Pipeline):
            return None
        return asdict(pipeline.kb.store.status())

    def model_names(self) -> list[str]:
        engine = self.engine
        names = [engine.model_id] if engine is not None else []
        return names + [a for a in self.settings.served_model_aliases if a not in names]

    def _engine_stats(self) -> dict[str, Any] | None:
        if self.engine is None:
            return None
        stats: dict[str, Any] = self.engine.stats()
        return stats


def build_pipeline(settings: Settings, engine: GenerationBackend) -> Pipeline:
    """The pipeline for ``settings.rag`` over ``engine``, on the document store the settings name:
    ``document_store`` (shared with other replicas), else ``index_dir`` (loaded when it holds an
    index, else started empty; every change is saved there; claimed for writing now, so a second
    server on it fails at startup), else memory. With ``settings.warm_up`` the embedder and tokenizer
    load now rather than on the first question. With ``settings.public_prefix_cache`` the shared
    collection's chunks are public material."""
    update: dict[str, Any] = {"engine": settings.engine}  # one engine config: the server's
    if settings.document_store is not None:
        update["document_store"] = settings.document_store
    elif settings.index_dir is not None:
        update["index_dir"] = settings.index_dir
    if settings.public_prefix_cache and settings.shared_collection is not None:
        update["public_collections"] = [settings.shared_collection]
    pipeline = Pipeline.from_config(settings.rag.model_copy(update=update), engine=engine)
    pipeline.kb.store.claim()
    if settings.warm_up:
        pipeline.warm_up()
    return pipeline


def _engine_assembler(engine: GenerationBackend) -> Any:
    """``PromptAssembler.assemble_messages`` over the engine's tokenizer, or None if it cannot apply."""
    tokenizer = engine.tokenizer
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    try:
        assembler = PromptAssembler(tokenizer, max_context_tokens=engine.max_context, max_tokens=1)
    except ValueError as exc:
        log.info("chat prompts use the engine's chat template: %s", exc)
        return None
    return assembler.assemble_messages
