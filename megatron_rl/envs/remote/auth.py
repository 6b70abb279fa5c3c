"""Bearer-token check, in constant time; no token configured means open access (loopback development)."""

from __future__ import annotations

import hmac

UNAUTHORIZED, FORBIDDEN = 401, 403


def check_bearer(header: str | None, token: str | None) -> int | None:
    """None when ``header`` carries ``token`` (or no token is configured); else 401 (no bearer) or 403 (wrong one)."""
    if token is None:
        return None
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        return UNAUTHORIZED
    return None if hmac.compare_digest(given.encode(), token.encode()) else FORBIDDEN
