"""The process's parts, built once from the settings and handed to both protocols: the engine
over the repository's registry (with the tenants' shares), model control with the repository's
loader, the metrics, the tracing, the API keys (which name the tenants) and each protocol's
options (`edges.options`: what a request may hold, the tracing, HTTP's docs page and OpenAI's
token ids, gRPC's address): the edges read no settings. Bulk work too: the HTTP routes in
process (`dispatch`: no application is built for it), handed to the jobs, `batch run` and
Ray Data. `running` runs what must run while serving. Imports load time, control, the core,
metrics, tracing, the API keys, the options and HTTP's in-process dispatch; never a
listener.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bucketserve.control import Control
from bucketserve.core.engine import Engine
from bucketserve.core.shares import Shares
from bucketserve.edges.auth import ApiKeys
from bucketserve.edges.failures import Failures
from bucketserve.edges.http.inprocess import InProcess
from bucketserve.edges.limits import Limits
from bucketserve.edges.options import GrpcOptions, HttpOptions
from bucketserve.jobs.jobs import Jobs
from bucketserve.loading import open_repository
from bucketserve.metrics import Metrics
from bucketserve.settings import Settings
from bucketserve.tracing import Tracing, configured


@dataclass(frozen=True)
class Wired:
    settings: Settings
    engine: Engine
    control: Control
    metrics: Metrics
    keys: ApiKeys
    http: HttpOptions  # HTTP's options (what one request may hold is every protocol's)
    grpc: GrpcOptions | None  # gRPC's (None: no --grpc-port)
    dispatch: InProcess  # the HTTP routes in process, for bulk work (the jobs', Ray Data's)
    jobs: Jobs  # bulk jobs, their lines sent by `dispatch`


def wire(settings: Settings) -> Wired:
    """Every part, from the settings: the repository opened (every model loaded and checked,
    or ConfigError naming each that failed), the keys read once."""
    keys = api_keys(settings)
    weights = settings.weights()
    shares = functools.partial(Shares, weights, reserve=keys.tenants_may_differ)
    opened = open_repository(settings)
    tracing = configured(settings.otlp_endpoint)
    engine = Engine(opened.registry, settings, opened.instances, tracing, shares, opened.memory)
    control = Control(
        engine,
        opened.loader if settings.model_control != "none" else None,
        poll=settings.model_control == "poll",
        interval_s=settings.poll_interval_s,
    )
    metrics = Metrics(keys.tenants | set(weights))
    http = http_options(settings, tracing)
    grpc = None if settings.grpc_port is None else grpc_options(settings, tracing)
    bulk = dispatch(engine, http, keys, metrics)
    jobs = Jobs(settings.jobs_dir or default_jobs_dir(), engine, metrics, settings, bulk)
    return Wired(settings, engine, control, metrics, keys, http, grpc, bulk, jobs)


def dispatch(engine: Engine, options: HttpOptions, keys: ApiKeys, metrics: Metrics) -> InProcess:
    """The HTTP routes a batch may run, in process, over these parts: a failure answered,
    counted and logged by the rule HTTP's are (`edges.failures`)."""
    return InProcess(engine, options, keys, Failures(metrics).settle)


def api_keys(settings: Settings) -> ApiKeys:
    """The keys the settings give (their file read once), each naming its tenant."""
    return ApiKeys(
        settings.api_keys(),
        settings.open_metrics,
        settings.docs,
        settings.tenant_header,
        settings.gateway_keys(),
    )


def limits(settings: Settings) -> Limits:
    """What one request may hold, whatever protocol brought it."""
    return Limits(
        settings.max_body_bytes,
        settings.max_sequences,
        settings.max_request_tokens,
        settings.auto_truncate,
    )


def http_options(settings: Settings, tracing: Tracing) -> HttpOptions:
    return HttpOptions(limits(settings), tracing, settings.docs, settings.openai_token_ids)


def grpc_options(settings: Settings, tracing: Tracing) -> GrpcOptions:
    return GrpcOptions(f"{settings.host}:{settings.grpc_port}", limits(settings), tracing)


def default_jobs_dir() -> Path:
    """$XDG_DATA_HOME/bucketserve/jobs, else ~/.local/share/bucketserve/jobs."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "bucketserve" / "jobs"


@contextlib.asynccontextmanager
async def running(
    engine: Engine, control: Control, metrics: Metrics, jobs: Jobs | None = None
) -> AsyncIterator[None]:
    """The engine's schedulers, model control's poller and the unfinished bulk jobs running
    inside the block; at its end, the jobs and the poller stopped, everything admitted
    answered (the drain), then the rest."""
    async with engine.running(metrics):
        control.start()
        if jobs is not None:
            jobs.resume()
        try:
            yield
        finally:
            if jobs is not None:
                await jobs.stop()
            await control.stop()
