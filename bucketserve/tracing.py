"""Traces, when configured: OpenTelemetry (the `tracing` extra), off unless `--otlp-endpoint`
or the standard `OTEL_*` variables say where to send them.

Who opens which span: an edge opens the request's (`request`, continuing a W3C `traceparent`
from its headers or gRPC metadata), the engine its admission (`span`), the scheduler each
sequence's wait in the queue (`queued`, from admission until its batch starts) and the batch
(`batch`, with the model, version, bucket edge, rows, padded tokens and instance). A batch
serves several requests, so it is a trace of its own, linked both ways: the batch span links
every queue span it took sequences from, and each of those links the batch, so one request's
trace shows the batch it shared.

Off, every method is a no-op returning shared objects: no OpenTelemetry import, no allocation
per request beyond a call. Nothing above this module imports OpenTelemetry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any

log = logging.getLogger(__name__)

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
Attributes = Mapping[str, str | int | float | bool]


class SpanNote:
    """What an edge may say of its request's span once it knows more (the route, the status)."""

    def set(self, key: str, value: str | int | float | bool) -> None:
        """An attribute."""

    def rename(self, name: str) -> None:
        """The span's name: the route's template, once routing found it."""


NO_NOTE = SpanNote()
# Off, every span is one of these, made once: entering and leaving them costs two calls.
NO_REQUEST_SPAN: contextlib.nullcontext[SpanNote] = contextlib.nullcontext(NO_NOTE)
NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


class Tracing:
    """Tracing off: every span a no-op."""

    enabled = False

    def request(self, name: str, carrier: Mapping[str, str]) -> ContextManager[SpanNote]:
        """The request's span, continuing the `traceparent` in `carrier` (headers, metadata)."""
        return NO_REQUEST_SPAN

    def span(self, name: str, attributes: Attributes) -> ContextManager[None]:
        """A span inside the current one."""
        return NO_SPAN

    def queued(self) -> Any:
        """A sequence's wait in the queue begins: a handle for `batch` (None when off)."""
        return None

    def batch(self, queued: Sequence[Any], attributes: Attributes) -> ContextManager[None]:
        """The batch's span, linked with the waits (`queued`) of its sequences, which end."""
        return NO_SPAN


class OpenTelemetryTracing(Tracing):
    """Spans through an OpenTelemetry tracer provider (the SDK's, or a test's)."""

    enabled = True

    def __init__(self, provider: Any) -> None:
        from opentelemetry import propagate, trace

        self._trace = trace
        self._propagate = propagate
        self._tracer = provider.get_tracer("bucketserve")

    @contextlib.contextmanager
    def request(self, name: str, carrier: Mapping[str, str]) -> Iterator[SpanNote]:
        parent = self._propagate.extract(carrier)
        kind = self._trace.SpanKind.SERVER
        with self._tracer.start_as_current_span(name, context=parent, kind=kind) as span:
            yield _Note(span)

    @contextlib.contextmanager
    def span(self, name: str, attributes: Attributes) -> Iterator[None]:
        with self._tracer.start_as_current_span(name, attributes=attributes):
            yield

    def queued(self) -> Any:
        return self._tracer.start_span("bucketserve.queue")  # (a child of the current span)

    @contextlib.contextmanager
    def batch(self, queued: Sequence[Any], attributes: Attributes) -> Iterator[None]:
        waits = [span for span in queued if span is not None]
        links = [self._trace.Link(span.get_span_context()) for span in waits]
        root = self._trace.set_span_in_context(self._trace.INVALID_SPAN)  # a trace of its own
        began = time.time_ns()
        with self._tracer.start_as_current_span(
            "bucketserve.batch", context=root, links=links, attributes=attributes, start_time=began
        ) as batch:
            for wait in waits:  # each request's wait ends where its batch begins
                wait.add_link(batch.get_span_context())
                wait.end(end_time=began)
            yield


class _Note(SpanNote):
    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: str | int | float | bool) -> None:
        self._span.set_attribute(key, value)

    def rename(self, name: str) -> None:
        self._span.update_name(name)


def configured(endpoint: str | None, environ: Mapping[str, str] | None = None) -> Tracing:
    """Tracing as the settings and the standard variables say: spans sent over OTLP/HTTP to
    `endpoint` (or to the `OTEL_EXPORTER_OTLP_*` endpoint), batched off the request path;
    otherwise off. `OTEL_TRACES_EXPORTER=none` turns it off, as it does for every SDK."""
    environ = os.environ if environ is None else environ
    wanted = endpoint is not None or any(environ.get(v) for v in ENDPOINT_VARIABLES)
    if not wanted or environ.get("OTEL_TRACES_EXPORTER") == "none":
        return Tracing()
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        from bucketserve.errors import ConfigError

        raise ConfigError(
            "tracing: the tracing extra is not installed: pip install 'bucketserve[tracing]'"
        ) from None
    provider = TracerProvider(
        resource=Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "bucketserve")})
    )
    url = None if endpoint is None else endpoint.rstrip("/") + "/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    log.info("tracing: spans sent over OTLP/HTTP to %s", url or "the OTEL_* endpoint")
    return OpenTelemetryTracing(provider)
