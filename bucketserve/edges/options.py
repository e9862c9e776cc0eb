"""What the process hands each protocol, built once from its settings (`process.wiring`):
what a request may hold (`Limits`), the tracing, and each protocol's own (HTTP's docs page
and how OpenAI's token ids are read; gRPC's address). An edge reads no settings: this is what
it is told. Imports the limits and the tracing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bucketserve.edges.limits import Limits
from bucketserve.tracing import Tracing


@dataclass(frozen=True)
class HttpOptions:
    """The HTTP edge's (the default: the process's for the default settings)."""

    limits: Limits = field(default_factory=Limits)
    tracing: Tracing = field(default_factory=Tracing)
    docs: bool = False  # Swagger UI at /docs, its assets served from here
    openai_token_ids: bool = False  # token ids sent to OpenAI's routes are the model's own


@dataclass(frozen=True)
class GrpcOptions:
    """The gRPC edge's: where it listens, what a message may hold, the tracing."""

    address: str  # host:port
    limits: Limits
    tracing: Tracing
