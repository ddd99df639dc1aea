"""Service settings: every knob of the HTTP layer, plus the engine's config, from ``PREFIXRAG_*`` env vars."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.config import EngineConfig
from engine.paths import kv_cache_dir
from engine.sampling import DEFAULT_MAX_TOKENS
from rag.config import RAGConfig, StoreURL
from rag.types import NAME_PATTERN, check_collection

_TENANT = re.compile(NAME_PATTERN)  # a tenant's private collection bears its name


class CollectionGrant(BaseModel):
    """The collections one tenant may read and write, replacing its defaults.

    Example:
        >>> CollectionGrant(read=["handbook"], write=["team-a"]).write
        ['team-a']
    """

    model_config = ConfigDict(extra="forbid")

    read: list[str] = Field(default_factory=list, description="collections it searches and lists")
    write: list[str] = Field(
        default_factory=list, description="collections it adds to and deletes from (also readable)"
    )

    @field_validator("read", "write")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        return [check_collection(name) for name in names]


# nginx's default; a load balancer in front should idle out sooner than this (AWS ALB: 60 s)
KEEP_ALIVE_S = 75


class Settings(BaseSettings):
    """What `create_app` needs. Nested configs read ``PREFIXRAG_ENGINE__CACHE_BYTES``-style variables.

    Example:
        >>> s = Settings(api_keys={"sk-alice": "alice"}, max_inflight=8)
        >>> s.auth_enabled, s.max_inflight
        (True, 8)

    From the environment (dicts are JSON)::

        PREFIXRAG_API_KEYS='{"sk-alice": "alice", "sk-bob": "bob"}'
        PREFIXRAG_ADMIN_KEY=sk-admin
        PREFIXRAG_SHARED_COLLECTION=handbook
        PREFIXRAG_TENANT_COLLECTIONS='{"bob": {"read": ["handbook", "alice"], "write": ["bob"]}}'
        PREFIXRAG_ENGINE__CACHE_BYTES=536870912
        PREFIXRAG_RAG__TOP_K=6
        PREFIXRAG_INDEX_DIR=/srv/prefixrag/index          # or, shared by many replicas:
        PREFIXRAG_DOCUMENT_STORE=postgresql://rag:secret@db:5432/rag
    """

    model_config = SettingsConfigDict(
        env_prefix="PREFIXRAG_", env_nested_delimiter="__", extra="ignore", protected_namespaces=()
    )

    # where to listen (used by `prefixrag serve`)
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    keep_alive_s: int = Field(
        default=KEEP_ALIVE_S,
        ge=1,
        description="how long an idle client connection stays open; longer than the clients' own "
        "pool expiry (httpx and the OpenAI SDK: 5 s) so that the client closes an idle connection "
        "first: a request sent just as the server closes it would be reset",
    )

    # what to serve
    engine: EngineConfig = Field(default_factory=EngineConfig)
    rag: RAGConfig = Field(default_factory=RAGConfig)
    index_dir: Path | None = Field(
        default=None, description="where the document index lives; loaded at start, saved after each change"
    )
    document_store: StoreURL | None = Field(
        default=None,
        description="a document store shared by every replica (postgresql://...) instead of index_dir",
    )
    served_model_aliases: list[str] = Field(
        default_factory=list, description="extra model names the OpenAI routes accept besides the engine's"
    )

    # tenancy and auth
    api_keys: dict[str, str] = Field(
        default_factory=dict,
        description="bearer key -> tenant; when set, every /v1 route needs one of these keys",
    )
    admin_key: SecretStr | None = Field(
        default=None, description="bearer key for admin routes (cache reset); also a valid tenant key"
    )
    admin_tenant: str = "admin"

    # who may read and write which document collections (used when api_keys are set)
    shared_collection: str | None = Field(
        default="shared",
        description="a collection every tenant reads and only the admin key writes (null: none); each "
        "tenant also reads and writes its own collection, named after it",
    )
    tenant_collections: dict[str, CollectionGrant] = Field(
        default_factory=dict,
        description="tenant -> {read: [...], write: [...]}: replaces that tenant's default access",
    )
    public_prefix_cache: bool = Field(
        default=False,
        description="let tenants reuse each other's KV of a prompt prefix made only of the system prompt "
        "and shared-collection chunks (a tenant can then tell, from cached_tokens and TTFT, that the same "
        "shared chunks were retrieved before); off: every tenant's cache stays its own",
    )

    # limits
    max_body_bytes: int = Field(default=8 << 20, ge=1024, description="larger request bodies get 413")
    max_inflight: int = Field(default=64, ge=1, description="concurrent generations; more get 429")
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After seconds on a 429 from the API cap")
    max_question_chars: int = Field(default=4000, ge=1)
    max_top_k: int = Field(default=20, ge=1)
    default_max_tokens: int = Field(
        default=DEFAULT_MAX_TOKENS, ge=1, description="when a request names no max_tokens"
    )
    max_tokens_limit: int = Field(
        default=2048,
        ge=1,
        description="larger max_tokens are refused: 400 on the OpenAI routes (OpenAI's answer), 422 on "
        "/v1/ask (a body field outside its published bounds, FastAPI's answer)",
    )
    max_messages: int = Field(default=256, ge=1)
    max_documents_per_request: int = Field(default=1000, ge=1)

    # shutdown
    shutdown_timeout_s: int = Field(
        default=30,
        ge=0,
        description="on SIGTERM/SIGINT: stop accepting connections, give in-flight requests (streams "
        "included) this long to finish, then cancel the rest and exit",
    )

    # startup and pages
    warm_up: bool = Field(
        default=True, description="load the embedder and tokenizer at startup, not on the first question"
    )
    enable_ui: bool = True

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, keys: dict[str, str]) -> dict[str, str]:
        for key, tenant in keys.items():
            if len(key) < 8:
                raise ValueError("every API key needs at least 8 characters")
            if not _TENANT.match(tenant):
                raise ValueError(
                    f"tenant {tenant!r} must be 1-64 characters of letters, digits and ._@:- (starting alphanumeric)"
                )
        return keys

    @field_validator("admin_tenant")
    @classmethod
    def _check_admin_tenant(cls, tenant: str) -> str:
        if not _TENANT.match(tenant):
            raise ValueError(f"admin_tenant {tenant!r} must be 1-64 characters of letters, digits and ._@:-")
        return tenant

    @field_validator("shared_collection")
    @classmethod
    def _check_shared(cls, name: str | None) -> str | None:
        return check_collection(name) if name is not None else None

    @model_validator(mode="after")
    def _check_collections(self) -> Settings:
        tenants = set(self.api_keys.values())
        if self.shared_collection is not None and self.shared_collection in tenants | {self.admin_tenant}:
            raise ValueError(
                f"shared_collection {self.shared_collection!r} is also a tenant's name (its private collection)"
            )
        unknown = sorted(set(self.tenant_collections) - tenants)
        if unknown:
            raise ValueError(f"tenant_collections names tenants that no API key maps to: {unknown}")
        private = sorted(set(self.rag.public_collections) - {self.shared_collection})
        if tenants and private:
            raise ValueError(
                f"rag.public_collections may only name the shared collection, not {private}: their KV "
                "would be shared with every tenant (use public_prefix_cache)"
            )
        return self

    @model_validator(mode="after")
    def _check_limits(self) -> Settings:
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"default_max_tokens ({self.default_max_tokens}) exceeds max_tokens_limit ({self.max_tokens_limit})"
            )
        admin = self.admin_key.get_secret_value() if self.admin_key else None
        if admin is not None and len(admin) < 8:
            raise ValueError("admin_key needs at least 8 characters")
        if admin is not None and admin in self.api_keys:
            raise ValueError("admin_key must differ from every tenant key")
        return self

    @model_validator(mode="after")
    def _one_source_per_setting(self) -> Settings:
        """The server's engine and index are ``engine`` and ``index_dir``; the copies nested in ``rag``
        would be ignored, so setting one is a startup error naming the variable to use instead."""
        misplaced = (
            ("engine", "PREFIXRAG_RAG__ENGINE__*", "PREFIXRAG_ENGINE__*"),
            ("index_dir", "PREFIXRAG_RAG__INDEX_DIR", "PREFIXRAG_INDEX_DIR"),
            ("document_store", "PREFIXRAG_RAG__DOCUMENT_STORE", "PREFIXRAG_DOCUMENT_STORE"),
        )
        for field, variable, instead in misplaced:
            if field in self.rag.model_fields_set:
                raise ValueError(f"rag.{field} ({variable}) is not used by the server: set {instead} instead")
        if self.index_dir is not None and self.document_store is not None:
            raise ValueError(
                "index_dir (PREFIXRAG_INDEX_DIR) and document_store (PREFIXRAG_DOCUMENT_STORE) name two "
                "stores: set one of them"
            )
        return self

    def with_disk_cache_default(self) -> Settings:
        """These settings with the disk KV tier in ``$PREFIXRAG_HOME/kv`` unless a folder is set or the
        tier is off (``PREFIXRAG_ENGINE__DISK_CACHE_BYTES=0``): what `prefixrag serve` runs with."""
        engine = self.engine
        if engine.disk_cache_dir is not None or engine.disk_cache_bytes == 0:
            return self
        return self.model_copy(
            update={"engine": engine.model_copy(update={"disk_cache_dir": kv_cache_dir()})}
        )

    def max_tokens_problem(self, *requested: int | None) -> str | None:
        """Why a request's ``max_tokens`` is refused (None: every value given is within
        ``max_tokens_limit``). The routes answer it with their own status (see ``max_tokens_limit``).

        >>> Settings(max_tokens_limit=64, default_max_tokens=8).max_tokens_problem(None, 65)
        "max_tokens=65 exceeds this server's limit of 64"
        """
        for value in requested:
            if value is not None and value > self.max_tokens_limit:
                return f"max_tokens={value} exceeds this server's limit of {self.max_tokens_limit}"
        return None

    @property
    def auth_enabled(self) -> bool:
        """Tenant keys are configured: /v1 routes need a bearer key."""
        return bool(self.api_keys)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment (``create_app``'s default; routes read the
    app's own through rag.api.deps.get_settings)."""
    return Settings()
