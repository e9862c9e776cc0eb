"""The API key that both protocols require when the server has one (`--api-key`,
`--api-key-file`): `Authorization: Bearer KEY` over HTTP, `authorization` metadata over gRPC.

Health and readiness stay open (orchestrators probe them without credentials), /metrics
when `--open-metrics` says so, and the docs page and its assets when `--docs` serves them (a
browser opens a page without headers: the page asks for the key and sends it with every call it
makes, the OpenAPI document's included). A key is compared with `hmac.compare_digest`, against every
key the server holds, so that how long a refusal takes says nothing of how much of a key was
right. A key is never logged: the settings hide it, and a refusal says only that it failed.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Sequence

from bucketserve.errors import Unauthorized

# HTTP paths and gRPC methods that need no key: liveness, readiness, a model's readiness.
OPEN_PATHS = re.compile(r"/v2/health/(live|ready)|/v2/models/[^/]+(/versions/[^/]+)?/ready")
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
METRICS_PATH = "/metrics"
DOCS_PATHS = re.compile(r"/docs(/[^/]+)?")
REFUSED = "a valid API key is required: send `Authorization: Bearer <key>`"


class ApiKeys:
    """The keys a request may carry; none: every request is let in."""

    def __init__(
        self, keys: Sequence[str], open_metrics: bool = False, open_docs: bool = False
    ) -> None:
        self._keys = tuple(key.encode() for key in keys)
        self.open_metrics = open_metrics
        self.open_docs = open_docs

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def open_path(self, path: str) -> bool:
        return (
            OPEN_PATHS.fullmatch(path) is not None
            or (self.open_metrics and path == METRICS_PATH)
            or (self.open_docs and DOCS_PATHS.fullmatch(path) is not None)
        )

    def check(self, authorizations: Sequence[str]) -> None:
        """Unauthorized unless the request carries exactly one authorization (header, or
        metadata entry), and it is `Bearer <one of the keys>`: with two, a proxy and the
        server could each read another."""
        if not self._keys:
            return
        if len(authorizations) > 1:
            raise Unauthorized(f"{len(authorizations)} authorizations sent: send one")
        scheme, _, token = (authorizations[0] if authorizations else "").partition(" ")
        given = token.strip().encode("latin-1", "replace")
        # Every key compared, each in constant time: the answer's timing depends on neither
        # which key matched nor how much of one did.
        matches = [hmac.compare_digest(given, key) for key in self._keys]
        if scheme.lower() != "bearer" or not any(matches):
            raise Unauthorized(REFUSED)
