"""The headers a request carries whatever its protocol (HTTP's headers, gRPC's metadata,
names compared lower-case): its id, its priority level and its own deadline, each read here
for both. A value that does not read is the request's error, naming the header.
"""

from __future__ import annotations

import math

from bucketserve.errors import MalformedRequest
from bucketserve.logs import request_id as _safe_id

REQUEST_ID = "x-request-id"
PRIORITY = "x-priority"
TIMEOUT = "x-request-timeout-ms"  # (HTTP's: over gRPC, the call's own deadline)


def request_id(given: str | None) -> str:
    """The request's id: the one given when it is safe to repeat, else a new one."""
    return _safe_id(given)


def priority_level(raw: str, where: str) -> int:
    """A priority level as a header (HTTP's X-Priority, gRPC's x-priority: `where`) sends
    it: digits. A number of any size is a level (the engine says which are this server's)."""
    text = raw.strip()
    if not (text.isascii() and text.isdigit()):
        raise MalformedRequest(f"{where} must be a level: 1 (first), 2, ...; 0 is the default")
    return int(text) if len(text) <= 18 else 10**18  # (past every server's levels)


def timeout_ms(raw: str | None) -> float | None:
    """The request's own deadline in ms (None: none given); it can only shorten the
    server's."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise MalformedRequest(f"X-Request-Timeout-Ms must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise MalformedRequest("X-Request-Timeout-Ms must be a positive number")
    return value
