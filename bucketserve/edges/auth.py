"""The API key that both protocols require when the server has one (`--api-key`,
`--api-key-file`): `Authorization: Bearer KEY` over HTTP, `authorization` metadata over gRPC.

Health and readiness stay open (orchestrators probe them without credentials), /metrics
when `--open-metrics` says so, and the docs page and its assets when `--docs` serves them (a
browser opens a page without headers: the page asks for the key and sends it with every call it
makes, the OpenAPI document's included). A key is compared with `hmac.compare_digest`, against every
key the server holds, so that how long a refusal takes says nothing of how much of a key was
right. A key is never logged: the settings hide it, and a refusal says only that it failed.

The key also names the request's tenant (its name in the key file; keys without one are the
one tenant ""): whose share of a model the request uses, and who owns the bulk files and
batches it makes. Behind a gateway that names tenants itself (`--tenant-header`), the header
names the tenant for the gateway's keys only (`gateway` on their line; where no line says so,
for keys that are all one tenant's, as a single key is), and never a tenant that is a key's
or a bulk job's: no key reaches another's tenant by naming it. A name is compared whole; one past
MAX_TENANT_CHARS is refused, never cut.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Collection, Mapping, Sequence

from bucketserve.errors import Forbidden, MalformedRequest, Unauthorized
from bucketserve.metrics import JOB_TENANT

# HTTP paths and gRPC methods that need no key: liveness, readiness, a model's readiness.
OPEN_PATHS = re.compile(r"/v2/health/(live|ready)|/v2/models/[^/]+(/versions/[^/]+)?/ready")
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
METRICS_PATH = "/metrics"
DOCS_PATHS = re.compile(r"/docs(/[^/]+)?")
REFUSED = "a valid API key is required: send `Authorization: Bearer <key>`"
MAX_TENANT_CHARS = 256  # a tenant header's value: past it, refused (a name is never cut)


class ApiKeys:
    """The keys a request may carry, each with its tenant's name; none: every request is let
    in."""

    def __init__(
        self,
        keys: Mapping[str, str] | Sequence[str],
        open_metrics: bool = False,
        open_docs: bool = False,
        tenant_header: str | None = None,
        gateways: Collection[str] = (),
    ) -> None:
        named = keys if isinstance(keys, Mapping) else dict.fromkeys(keys, "")
        self._keys = tuple(key.encode() for key in named)
        self._tenants = tuple(named.values())
        self._gateways = tuple(key in gateways for key in named)
        self.open_metrics = open_metrics
        self.open_docs = open_docs
        self.header_name = tenant_header  # (as the operator wrote it: what a refusal says)
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
        return self._tenants[self._matched(authorizations)]

    def _matched(self, authorizations: Sequence[str]) -> int:
        """Which key the request carries (`check` says the rule)."""
        if len(authorizations) > 1:
            raise Unauthorized(f"{len(authorizations)} authorizations sent: send one")
        scheme, _, token = (authorizations[0] if authorizations else "").partition(" ")
        given = token.strip().encode("latin-1", "replace")
        # Every key compared, each in constant time: the answer's timing depends on neither
        # which key matched nor how much of one did.
        matches = [hmac.compare_digest(given, key) for key in self._keys]
        if scheme.lower() != "bearer" or not any(matches):
            raise Unauthorized(REFUSED)
        return matches.index(True)

    def tenant(self, authorizations: Sequence[str], named: Sequence[str]) -> str:
        """A request's tenant: its key's ("" without keys, or on a route open without one),
        or the one the tenant header's values (`named`) give, where its key may name one
        (the module docstring's rule). MalformedRequest for two values or a name past
        MAX_TENANT_CHARS; Forbidden for a key that may not name it."""
        index: int | None = None
        if self._keys:
            try:
                index = self._matched(authorizations)
            except Unauthorized:  # (a route open without a key)
                return ""
        own = "" if index is None else self._tenants[index]
        if self.tenant_header is None or not any(named):
            return own
        if len(named) > 1:  # (a gateway's and a client's: either could be read)
            raise MalformedRequest(f"{len(named)} {self.header_name} headers sent: send one")
        given = named[0]
        if len(given) > MAX_TENANT_CHARS:
            raise MalformedRequest(
                f"{self.header_name}: a tenant's name is at most {MAX_TENANT_CHARS} characters"
            )
        if given == own:
            return own
        if index is not None and not self._may_name(index):
            raise Forbidden(
                f"this API key may not name a tenant in {self.header_name}: a gateway's key "
                "may (`gateway` at the end of its line in --api-key-file)"
            )
        if given in self.tenants or given.startswith(JOB_TENANT):
            raise Forbidden(
                f"{self.header_name} names the tenant of an API key or a bulk job: a gateway "
                "names tenants of its own"
            )
        return given

    def _may_name(self, index: int) -> bool:
        """Whether key `index` may name tenants: a gateway's, where a line says which; where
        none does, any key when every key is one tenant's (one key, or two in a rotation),
        since no other key's tenant is there to reach."""
        if any(self._gateways):
            return self._gateways[index]
        return len(self.tenants) == 1
