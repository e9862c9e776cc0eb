"""The FastAPI application factory: wiring only. The routes live beside it: the vendors' APIs
in the table of dialects (`routes`, each path registered once from its rows), KServe v2's
(`kserve_routes`), the Batch API's (`batch_api`) and the document (`contract`); and so do
the middleware (`context`, and `guard` when the server has an API key); errors are answered
here, as `edges.failures` rules for both protocols, in the form of the route they came in on
(`routes.form_of`).

`create_app(engine, control, metrics, keys, options)`: the app serves what the process (or a
test) built and runs, as the process's options say (`edges.options`: limits, tracing, the
docs page); it loads nothing, starts nothing and reads no settings. Imports the routes beside
it, the core's engine, model control, the API keys and the rule for failures
(`edges.failures`).
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException

from bucketserve.about import NAME, VERSION
from bucketserve.control import Control
from bucketserve.core.engine import Engine
from bucketserve.edges.auth import ApiKeys
from bucketserve.edges.failures import CLIENT_CLOSED, Failures
from bucketserve.edges.http import batch_api, contract, kserve_routes, routes, table
from bucketserve.edges.http.common import (
    REFUSED,
    ClientGone,
    error_response,
    json_response,
)
from bucketserve.edges.http.context import RequestContext
from bucketserve.edges.http.guard import RequireKey
from bucketserve.edges.options import HttpOptions
from bucketserve.errors import BucketserveError, InvalidInput
from bucketserve.jobs.jobs import Jobs
from bucketserve.metrics import Metrics


class RoutingError(BucketserveError):
    """The framework's own refusals (no such route, a method the route does not take)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def create_app(
    engine: Engine,
    control: Control | None = None,
    metrics: Metrics | None = None,
    keys: ApiKeys | None = None,
    options: HttpOptions | None = None,
    jobs: Jobs | None = None,
) -> FastAPI:
    """The app over `engine`; `control`: model control (default: off); `metrics`: where
    requests are counted (the process's, shared with gRPC); `keys`: the API keys required
    (default: none); `options`: the process's for HTTP (default: the default settings');
    `jobs`: the bulk jobs, whose files and batches the app serves (default: off; the
    process runs them)."""
    metrics = metrics or Metrics()
    keys = keys or ApiKeys(())
    options = options or HttpOptions()
    app = FastAPI(
        title=NAME,
        version=VERSION,
        description="Length-bucketed inference for variable-length sequence models.",
        docs_url=None,  # (a setting: below)
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.control = control or Control(engine, None)
    app.state.metrics = metrics
    app.state.keys = keys
    app.state.options = options
    app.state.jobs = jobs
    dialects = APIRouter()  # (the vendors' APIs, each path once, from the table's rows)
    table.register(dialects, routes.ROWS)
    for router in (kserve_routes.router, dialects, batch_api.router):
        app.include_router(router)
    registry = engine.registry
    versions = [str(model.info.version) for model in registry.models.values()]
    names = [*registry.models, *registry.failed, *registry.aliases]
    exact = table.exact_names(routes.ROWS)
    contract.describe_server(app, names, versions, options.limits.max_sequences, exact)
    if options.docs:
        contract.serve_docs(app, keys.required)

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    )
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    failures = Failures(metrics)  # (what is answered, counted and logged: one rule)

    def settled(request: Request, raised: BaseException) -> Response:
        where = f"{request.method} {request.url.path}"
        return error_response(failures.settle(raised, where), routes.form_of(request.url.path))

    @app.exception_handler(BucketserveError)
    async def on_error(request: Request, exc: BucketserveError) -> Response:
        return settled(request, exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        return settled(request, InvalidInput(str(exc.errors())))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> Response:
        return settled(request, exc)

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, exc: ClientGone) -> Response:
        refused = request.scope.get("extensions", {}).get(REFUSED)
        if refused is not None:  # (answered by the connection, that refused its body)
            return settled(request, refused)
        failures.client_left(f"{request.method} {request.url.path}")
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(HTTPException)
    async def on_http(request: Request, exc: HTTPException) -> Response:
        """The framework's routing (no such route, a method it does not take): answered in
        the error form, not a request to any model."""
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        error = RoutingError(exc.status_code, code, str(exc.detail))
        return json_response(
            routes.error_body(error, request.url.path),
            exc.status_code,
            dict(exc.headers or {}),  # 405's Allow
        )

    if keys.required:  # (inside the context: a refusal has its request id, and is counted)
        app.add_middleware(RequireKey, keys=keys, failures=failures)
        contract.document_key(app, keys.open_path)

    app.add_middleware(
        RequestContext,
        metrics=metrics,
        draining=lambda: engine.draining,
        tracing=options.tracing,
    )
    return app
