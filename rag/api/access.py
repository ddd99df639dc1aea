"""Which document collections a caller may read and write, and the checks routers apply.

Single-user mode (no tenant keys): one user, every collection, writes go to ``"default"``. With
tenant keys: a tenant reads and writes its own collection (named after it) and reads the shared one;
``Settings.tenant_collections`` replaces that per tenant; the admin key reads and writes every
collection. A collection the caller may not read answers 404 exactly as one that does not exist (the
check looks at the caller's grants only, never at what is stored), so refusals reveal nothing.

Example:
    >>> from rag.api.auth import Principal
    >>> from rag.api.settings import Settings
    >>> access = access_for(Principal("alice"), Settings(api_keys={"sk-alice-123": "alice"}))
    >>> access.home, access.can_read("shared"), access.can_write("shared"), access.can_read("bob")
    ('alice', True, False, False)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rag.api.auth import Principal
from rag.api.errors import api_error
from rag.api.settings import Settings
from rag.types import DEFAULT_COLLECTION


@dataclass(frozen=True)
class Access:
    """One caller's collections: ``read``/``write`` None means every collection.

    ``home`` is where its writes go when a request names no collection (None: it may write nowhere).
    """

    home: str | None
    read: frozenset[str] | None
    write: frozenset[str] | None

    def can_write(self, name: str) -> bool:
        return self.write is None or name in self.write

    def can_read(self, name: str) -> bool:
        return self.read is None or name in self.read or self.can_write(name)

    def readable_collections(self, existing: Iterable[str]) -> list[str]:
        """Every collection it may read, its home first: the granted ones (stored or not yet), or
        with access to all, the ``existing`` ones."""
        names = list(existing) if self.read is None else sorted(self.read | (self.write or frozenset()))
        first = [self.home] if self.home is not None and self.can_read(self.home) else []
        return list(dict.fromkeys([*first, *names]))


def access_for(principal: Principal, settings: Settings) -> Access:
    """The access ``settings`` give ``principal``."""
    if not settings.auth_enabled:
        return Access(home=DEFAULT_COLLECTION, read=None, write=None)
    if principal.admin:
        return Access(home=principal.tenant, read=None, write=None)
    tenant = principal.tenant
    grant = settings.tenant_collections.get(tenant)
    if grant is not None:
        write = frozenset(grant.write)
        home = tenant if tenant in write else (grant.write[0] if grant.write else None)
        return Access(home=home, read=frozenset(grant.read) | write, write=write)
    shared = {settings.shared_collection} if settings.shared_collection else set()
    return Access(home=tenant, read=frozenset({tenant, *shared}), write=frozenset({tenant}))


# ---- the checks routers apply (HTTP errors) --------------------------------------------------------


def require_readable(access: Access, name: str) -> str:
    """``name`` if the caller may read it, else 404 (the same answer as for a collection that does not
    exist)."""
    if not access.can_read(name):
        raise api_error(
            404,
            f"no collection named {name!r} is available to this key",
            param="collection",
            code="collection_not_found",
        )
    return name


def write_target(access: Access, name: str | None) -> str:
    """The collection a write goes to (``name``, else the caller's home): 404 if it may not read it,
    403 if it may only read it."""
    target = name if name is not None else access.home
    if target is None:
        raise api_error(
            403, "this key may not add or delete documents anywhere", param="collection", code="read_only_key"
        )
    require_readable(access, target)
    if not access.can_write(target):
        raise api_error(
            403,
            f"collection {target!r} is read-only for this key",
            param="collection",
            code="collection_read_only",
        )
    return target


def search_scope(access: Access, requested: Sequence[str] | None) -> list[str] | None:
    """The collections a search reads: the ``requested`` ones (each must be readable: 404 otherwise),
    else every readable one (None: every collection)."""
    if requested is not None:
        return [require_readable(access, name) for name in dict.fromkeys(requested)]
    if access.read is None:
        return None
    return access.readable_collections(())
