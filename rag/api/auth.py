"""Bearer-key authentication: which tenant a request belongs to, decided in constant time."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

ANONYMOUS = ""  # the tenant (cache namespace) of every request when no keys are configured
_SALT_SEP = "\x1e"  # tenant names never contain control characters, so tenant+salt cannot collide


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant (the cache namespace), and whether it holds the admin key.

    Example:
        >>> Principal("alice").namespace("session-7")
        'alice\\x1esession-7'
        >>> Principal("alice").namespace()
        'alice'
    """

    tenant: str
    admin: bool = False

    def namespace(self, cache_salt: str | None = None) -> str:
        """The engine cache namespace; a client's ``cache_salt`` subdivides its tenant, never crosses it."""
        return f"{self.tenant}{_SALT_SEP}{cache_salt}" if cache_salt else self.tenant


class KeyRing:
    """Bearer keys mapped to tenants, checked without timing leaks.

    Every configured key is compared (SHA-256 digests through ``hmac.compare_digest``, so lengths leak
    nothing either) and the loop never exits early.

    Example:
        >>> ring = KeyRing({"sk-alice-123": "alice"}, admin_key="sk-admin-123")
        >>> ring.lookup("sk-alice-123")
        Principal(tenant='alice', admin=False)
        >>> ring.lookup("sk-nope") is None
        True
    """

    def __init__(
        self, keys: Mapping[str, str], admin_key: str | None = None, admin_tenant: str = "admin"
    ) -> None:
        self._entries: list[tuple[bytes, Principal]] = [
            (_digest(key), Principal(tenant)) for key, tenant in keys.items()
        ]
        if admin_key:
            self._entries.append((_digest(admin_key), Principal(admin_tenant, admin=True)))
        self.required = bool(keys)

    def lookup(self, token: str | None) -> Principal | None:
        """The principal whose key equals ``token``, or None."""
        probe = _digest(token or "")
        found: Principal | None = None
        for digest, principal in self._entries:
            if hmac.compare_digest(digest, probe) and token:
                found = principal
        return found


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()
