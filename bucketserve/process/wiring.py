"""The process's parts, built once from the settings and handed to both protocols: the engine
over the repository's registry (with the tenants' shares), model control with the repository's
loader, the metrics, the tracing and the API keys (which name the tenants). `running` runs
what must run while serving. Imports load time, control, the core, metrics, tracing and the
API keys; never a protocol.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass

from bucketserve.control import Control
from bucketserve.core.engine import Engine
from bucketserve.core.shares import Shares
from bucketserve.edges.auth import ApiKeys
from bucketserve.edges.limits import Limits
from bucketserve.loading import open_repository
from bucketserve.metrics import Metrics
from bucketserve.settings import Settings
from bucketserve.tracing import configured


@dataclass(frozen=True)
class Wired:
    settings: Settings
    engine: Engine
    control: Control
    metrics: Metrics
    keys: ApiKeys
    limits: Limits  # what one request may hold, for every protocol


def wire(settings: Settings) -> Wired:
    """Every part, from the settings: the repository opened (every model loaded and checked,
    or ConfigError naming each that failed), the keys read once."""
    keys = ApiKeys(
        settings.api_keys(), settings.open_metrics, settings.docs, settings.tenant_header
    )
    weights = settings.weights()
    shares = functools.partial(Shares, weights, reserve=keys.tenants_may_differ)
    opened = open_repository(settings)
    tracing = configured(settings.otlp_endpoint)
    engine = Engine(opened.registry, settings, opened.instances, tracing, shares)
    control = Control(
        engine,
        opened.loader if settings.model_control != "none" else None,
        poll=settings.model_control == "poll",
        interval_s=settings.poll_interval_s,
    )
    metrics = Metrics(keys.tenants | set(weights))
    return Wired(settings, engine, control, metrics, keys, Limits.of(settings))


@contextlib.asynccontextmanager
async def running(engine: Engine, control: Control, metrics: Metrics) -> AsyncIterator[None]:
    """The engine's schedulers and model control's poller running inside the block; at its
    end, the poller stopped, everything admitted answered (the drain), then the rest."""
    async with engine.running(metrics):
        control.start()
        try:
            yield
        finally:
            await control.stop()
