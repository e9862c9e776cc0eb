"""The API key that both protocols require when the server has one (`--api-key`,
`--api-key-file`): `Authorization: Bearer KEY` over HTTP, `authorization` metadata over gRPC.

Health and readiness stay open (orchestrators probe them without credentials), /metrics
when `--open-metrics` says so, and the docs page and its assets when `--docs` serves them (a
browser opens a page without headers: the page asks for the key and sends it with every call it
makes, the OpenAPI document's included). A key is compared with `hmac.compare_digest`, against every
key the server holds, so that how long a refusal takes says nothing of how much of a key was
right. A key is never logged: the settings hide it, and a refusal says only that it failed.

The key also names the request's tenant (its name in the key file), unless the operator names
a header that does (`--tenant-header`, set by a gateway in front): whose share of a model the
request uses.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping, Sequence

from bucketserve.errors import Unauthorized
from bucketserve.settings import unnamed_tenant

# HTTP paths and gRPC methods that need no key: liveness, readiness, a model's readiness.
OPEN_PATHS = re.compile(r"/v2/health/(live|ready)|/v2/models/[^/]+(/versions/[^/]+)?/ready")
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
METRICS_PATH = "/metrics"
DOCS_PATHS = re.compile(r"/docs(/[^/]+)?")
REFUSED = "a valid API key is required: send `Authorization: Bearer <key>`"
MAX_TENANT_CHARS = 128


class ApiKeys:
    """The keys a request may carry, each with its tenant's name; none: every request is let
    in."""

    def __init__(
        self,
        keys: Mapping[str, str] | Sequence[str],
        open_metrics: bool = False,
        open_docs: bool = False,
        tenant_header: str | None = None,
    ) -> None:
        named = keys if isinstance(keys, Mapping) else {k: unnamed_tenant(k) for k in keys}
        self._keys = tuple(key.encode() for key in named)
        self._tenants = tuple(named.values())
        self.open_metrics = open_metrics
        self.open_docs = open_docs
        self.tenant_header = tenant_header.lower() if tenant_header else None

    @property
    def required(self) -> bool:
        return bool(self._keys)

    @property
    def tenants(self) -> frozenset[str]:
        """The tenants the keys name."""
        return frozenset(self._tenants)

    @property
    def tenants_may_differ(self) -> bool:
        """Whether requests may come from more than one tenant."""
        return self.tenant_header is not None or len(self.tenants) > 1

    def open_path(self, path: str) -> bool:
        return (
            OPEN_PATHS.fullmatch(path) is not None
            or (self.open_metrics and path == METRICS_PATH)
            or (self.open_docs and DOCS_PATHS.fullmatch(path) is not None)
        )

    def check(self, authorizations: Sequence[str]) -> str:
        """The tenant of the key the request carries ("" when no key is required), or
        Unauthorized unless it carries exactly one authorization (header, or metadata entry)
        and it is `Bearer <one of the keys>`: with two, a proxy and the server could each
        read another."""
        if not self._keys:
            return ""
        if len(authorizations) > 1:
            raise Unauthorized(f"{len(authorizations)} authorizations sent: send one")
        scheme, _, token = (authorizations[0] if authorizations else "").partition(" ")
        given = token.strip().encode("latin-1", "replace")
        # Every key compared, each in constant time: the answer's timing depends on neither
        # which key matched nor how much of one did.
        matches = [hmac.compare_digest(given, key) for key in self._keys]
        if scheme.lower() != "bearer" or not any(matches):
            raise Unauthorized(REFUSED)
        return self._tenants[matches.index(True)]

    def tenant(self, authorizations: Sequence[str], named: str | None) -> str:
        """A request's tenant: the header's (`named`) when the operator names one and the
        request sends it, else its key's; "" when neither says."""
        if self.tenant_header is not None and named:
            return named[:MAX_TENANT_CHARS]
        try:
            return self.check(authorizations)
        except Unauthorized:  # (a route open without a key)
            return ""
