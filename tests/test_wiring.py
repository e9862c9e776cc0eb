"""The process wires what the edges are told (`process.wiring`): the edges read no settings,
so the options an app or a listener is built with by default must be what the process builds
from the default settings."""

from __future__ import annotations

from bucketserve.edges.limits import Limits
from bucketserve.edges.options import HttpOptions
from bucketserve.process.wiring import grpc_options, http_options, limits
from bucketserve.settings import Settings
from bucketserve.tracing import Tracing


def test_the_edges_defaults_are_the_default_settings() -> None:
    tracing = Tracing()
    assert limits(Settings()) == Limits()
    assert http_options(Settings(), tracing) == HttpOptions(Limits(), tracing)


def test_the_options_are_the_settings() -> None:
    settings = Settings(
        max_body_bytes=1000,
        max_sequences=3,
        max_request_tokens=77,
        auto_truncate=False,
        docs=True,
        openai_token_ids=True,
        host="0.0.0.0",
        grpc_port=9001,
    )
    tracing = Tracing()
    told = Limits(1000, 3, 77, auto_truncate=False)
    assert http_options(settings, tracing) == HttpOptions(told, tracing, True, True)
    grpc = grpc_options(settings, tracing)
    assert (grpc.address, grpc.limits, grpc.tracing) == ("0.0.0.0:9001", told, tracing)
