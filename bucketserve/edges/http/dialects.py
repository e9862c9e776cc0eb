"""The API dialects the HTTP edge speaks, by path, and how each answers an error: the one place
that decides an error's body on every route (the routes, the app's handlers, the key guard and
the connection that refuses a body before the app sees it all ask `error_body`).

- `KSERVE`: KServe v2's routes (`/v2/...`, but Cohere's two under its prefix): the protocol's
  `{"error": message}`, which tritonclient and KServe's clients read, our code beside it.
- `OPENAI`: OpenAI's prefix (`/v1/...`): the one error form, with OpenAI's `type` and `param`,
  which its SDKs read.
- `OURS`: every other route: the one error form (`errors.error_form`).

Imports the errors and the schemas that document each form.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel

from bucketserve.edges.http.schemas import WHY, ErrorBody, OpenAIError, V2ErrorBody
from bucketserve.errors import BucketserveError, brief, error_form

OPENAI_PREFIX = "/v1/"
KSERVE_PREFIX = "/v2/"
COHERE_V2 = ("/v2/rerank", "/v2/embed")  # Cohere's (and Jina's) routes under KServe's prefix


class Dialect(Enum):
    KSERVE = "kserve"
    OPENAI = "openai"
    OURS = "ours"

    @property
    def error_schema(self) -> type[BaseModel]:
        """The schema of its error answers, for the OpenAPI document."""
        schemas: dict[Dialect, type[BaseModel]] = {
            Dialect.KSERVE: V2ErrorBody,
            Dialect.OPENAI: OpenAIError,
        }
        return schemas.get(self, ErrorBody)


def dialect_of(path: str) -> Dialect:
    """The dialect of the route at `path`."""
    if path.startswith(KSERVE_PREFIX) and path not in COHERE_V2:
        return Dialect.KSERVE
    if path.startswith(OPENAI_PREFIX):
        return Dialect.OPENAI
    return Dialect.OURS


def error_body(error: BucketserveError, path: str) -> dict[str, Any]:
    """`error` as the route at `path` answers errors (its dialect's form)."""
    dialect = dialect_of(path)
    if dialect is Dialect.KSERVE:
        return {"error": brief(error.message), "code": error.code}
    detail: dict[str, Any] = error_form(error.code, error.message)["error"]
    if dialect is Dialect.OPENAI:
        kind = "server_error" if error.status >= 500 else "invalid_request_error"
        detail |= {"type": kind, "param": error.param}
    return {"error": detail}


def errors(dialect: Dialect, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses of a route of `dialect`, in its form."""
    schema = dialect.error_schema
    return {status: {"model": schema, "description": WHY[status]} for status in statuses}
