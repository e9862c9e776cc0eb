"""How the table of dialects (`routes`) works: its rows, a `Path` of the routes that take
its bodies (`Route`: a dialect, a vendor's codec, and `when` a body is its) and a `Get` of a
vendor's page; how a request at a path is answered (`answer`: the first route whose `when`
its body meets, its codec's call through the engine's one call); and how the rows are
registered on an app, each path once, with the bodies the document says they take
(`register`), those a batch may run marked (`batchable`). The rows themselves are
`routes`'.

A path's routes share its errors' form: a body's dialect is known only once it is parsed,
and a body too large or not JSON is refused before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response

from bucketserve.edges.http.codec import Codec, Page, documented_body, said_stand_in
from bucketserve.edges.http.common import (
    answer_of,
    completed,
    json_response,
    limits_of,
    read_json,
)
from bucketserve.edges.http.dialects import Dialect, Form, errors
from bucketserve.edges.http.schemas import inlined
from bucketserve.edges.limits import Budget
from bucketserve.errors import BucketserveError, MalformedRequest

When = Callable[[Any, Request], bool]  # (the parsed body, the request): whether it is a route's
Misread = Callable[[MalformedRequest, Any, Request], BucketserveError]
Otherwise = Callable[[Any, Request], BucketserveError]


def always(body: Any, request: Request) -> bool:
    return True


@dataclass(frozen=True)
class Route:
    """One body a path takes: the dialect it is answered in, the vendor's codec that reads
    it and answers it, and which bodies at the path are its (`when`, of the parsed body).
    `misread`: what a malformed request means at this route (None: itself)."""

    dialect: Dialect
    codec: Codec[Any]
    when: When = always
    documented: bool = True  # (its body among the path's in the document)
    misread: Misread | None = None


@dataclass(frozen=True)
class Path:
    """A POST path and the routes that take its bodies, the first whose `when` holds
    answering; `otherwise`: the error when none does (None: one always does)."""

    path: str
    summary: str
    routes: tuple[Route, ...]
    tag: str | None = None  # its operation's tag (default: its first route's vendor)
    name: str | None = None  # its operation's name (default: its first route's codec's)
    about: str | None = None  # its operation's description (default: its first codec's)
    otherwise: Otherwise | None = None
    # Whether a batch may run it (a file of its bodies: the Batch API's endpoint, `batch
    # run`), and where it stands in the list of those the Batch API gives (None: it may not)
    batch: int | None = None

    def __post_init__(self) -> None:
        if len({route.dialect.form for route in self.routes}) != 1:
            raise ValueError(f"{self.path}: its routes answer errors in one form")

    @property
    def form(self) -> Form:
        return self.routes[0].dialect.form

    @property
    def statuses(self) -> tuple[int, ...]:
        return tuple(sorted({s for route in self.routes for s in route.codec.statuses}))

    @property
    def bodies(self) -> list[Route]:
        """The routes whose bodies the document lists, each body once, in order."""
        found: list[Route] = []
        for route in self.routes:
            if route.documented and all(route.codec.body is not r.codec.body for r in found):
                found.append(route)
        return found

    @property
    def single(self) -> bool:
        """Whether one route takes every body (the body is read by its codec alone)."""
        return len(self.routes) == 1 and self.routes[0].when is always and not self.otherwise

    def budget(self, request: Request) -> Budget:
        """What a body may hold before it is told apart: the most any of its routes' may."""
        default = limits_of(request).json()
        budgets = [r.codec.budget(request) if r.codec.budget else default for r in self.routes]
        values = [b.values for b in budgets]
        return Budget(
            max(b.bytes for b in budgets),
            max(b.steps for b in budgets),
            None if None in values else max(v for v in values if v is not None),
        )

    def route_for(self, body: Any, request: Request) -> Route:
        for route in self.routes:
            if route.when(body, request):
                return route
        if self.otherwise is None:
            raise AssertionError(f"{self.path}: no route takes the body")
        raise self.otherwise(body, request)


@dataclass(frozen=True)
class Get:
    """A GET path and the vendor's page it serves."""

    path: str
    dialect: Dialect
    page: Page


Row = Path | Get


async def answer(request: Request, path: Path) -> Response:
    """The request at `path`, answered by the route its body is."""
    if path.single:
        return await answered(request, path.routes[0])
    body: Any = await read_json(request, path.budget(request))
    route = path.route_for(body, request)
    try:
        return await answered(request, route)
    except MalformedRequest as exc:
        if route.misread is None:
            raise
        raise route.misread(exc, body, request) from None


async def answered(request: Request, route: Route) -> Response:
    """The route's body read, made its call (with the request's deadline, id, priority and
    tenant, and a name that is a hint where the dialect's are), run through the engine, and
    answered in the codec's JSON."""
    codec = route.codec
    body: Any = await codec.read(request)
    call = completed(request, codec.call(request, body), route.dialect.names_are_hints)
    try:
        answer = await answer_of(request, call)
    except BucketserveError as exc:  # (about the call's inputs, where the codec says so)
        if codec.blames is None or exc.param is not None or exc.status >= 500:
            raise
        raise exc.about(codec.blames) from None
    said_stand_in(request, answer)
    return json_response(codec.answer(request, body, answer))


def register(router: APIRouter, rows: Iterable[Row]) -> None:
    """Every row on `router`, in order: each path once, documented as its rows say."""
    for row in rows:
        if isinstance(row, Get):
            page = row.page
            options = dict(page.options)
            if page.statuses:
                options["responses"] = errors(row.dialect, *page.statuses)
            router.add_api_route(
                row.path,
                page.endpoint,
                methods=["GET"],
                summary=page.summary,
                tags=[page.vendor],
                **options,
            )
            continue
        first = row.routes[0].codec
        bodies = [documented(route.codec) for route in row.bodies]
        router.add_api_route(
            row.path,
            endpoint_of(row),
            methods=["POST"],
            name=row.name or first.name,
            summary=row.summary,
            description=row.about or first.about,
            tags=[row.tag or first.vendor],
            response_model=first.answers,
            responses=errors(row.routes[0].dialect, *row.statuses),
            openapi_extra=documented_body(
                bodies[0] if len(bodies) == 1 else {"anyOf": bodies}, row.statuses
            ),
        )


def documented(codec: Codec[Any]) -> dict[str, Any]:
    return codec.body if isinstance(codec.body, dict) else inlined(codec.body)


def endpoint_of(path: Path) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await answer(request, path)

    return endpoint


def batchable(rows: Iterable[Row]) -> list[Path]:
    """The paths a batch may run, in the order their rows say."""
    marked = [row for row in rows if isinstance(row, Path) and row.batch is not None]
    return sorted(marked, key=lambda path: path.batch or 0)


def exact_names(rows: Iterable[Row]) -> dict[str, tuple[bool, ...]]:
    """Each POST path's documented bodies, whether each takes only the names served (where a
    name is a hint, any name goes: `Dialect.names_are_hints`); for the document
    (`contract.describe_server`)."""
    return {
        row.path: tuple(not route.dialect.names_are_hints for route in row.bodies)
        for row in rows
        if isinstance(row, Path)
    }
