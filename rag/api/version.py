"""The installed prefixrag version, for the OpenAPI document and ``/server_info``."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """The installed distribution's version; ``0.0.0`` when running from a tree that is not installed.

    >>> package_version().count(".") >= 2
    True
    """
    try:
        return version("prefixrag")
    except PackageNotFoundError:
        return "0.0.0"
