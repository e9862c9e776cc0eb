"""The API dialects the HTTP edge speaks, by path, and how each answers an error: the one place
that decides an error's body on every route (the routes, the app's handlers, the key guard and
the connection that refuses a body before the app sees it all ask `error_body`). Each form
holds the keys its clients read, and our code:

- `BARE`: the paths without a prefix (text-embeddings-inference's and ours beside them) and
  KServe v2's: `{"error": message, "error_type": kind, "code": code}`, TEI's `ErrorResponse`,
  which huggingface_hub, Haystack and LangChain read, and KServe's `{"error": message}`, which
  tritonclient and KServe's clients read.
- `HOSTED`: the paths of the hosted APIs (OpenAI's `/v1/...`, Cohere's and Jina's, and the
  copies TEI, vLLM and Infinity serve: `/embeddings`, `/models`, `/score`, Cohere's two
  under `/v2`):
  OpenAI's `{"error": {"message", "type", "param", "code"}}`, which its SDKs read, with
  Cohere's `message` and Jina's `detail` beside it (Jina's clients raise `KeyError` without).

Imports the errors and the schemas that document each form.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel

from bucketserve.edges.http.schemas import WHY, ErrorBody, HostedError
from bucketserve.errors import BucketserveError, ModelNotReady, Unavailable, brief

HOSTED_PREFIXES = ("/v1/", "/models/")
HOSTED_PATHS = frozenset({"/embeddings", "/models", "/score", "/v2/rerank", "/v2/embed"})


class Dialect(Enum):
    BARE = "bare"
    HOSTED = "hosted"

    @property
    def error_schema(self) -> type[BaseModel]:
        """The schema of its error answers, for the OpenAPI document."""
        return HostedError if self is Dialect.HOSTED else ErrorBody


def dialect_of(path: str) -> Dialect:
    """The dialect of the route at `path`."""
    hosted = path.startswith(HOSTED_PREFIXES) or path in HOSTED_PATHS
    return Dialect.HOSTED if hosted else Dialect.BARE


NAMED_BY_HINT = frozenset({"/v1/embeddings", "/embeddings"})  # TEI's and Infinity's too


def names_are_hints(path: str) -> bool:
    """Whether the servers of `path` ignore the model a body names (TEI serves one model,
    Infinity's clients send `default/not-specified`): its bare paths, and the embeddings
    route TEI and Infinity serve beside OpenAI. There a name none answers to goes to the one
    model that serves the task (`Call.stand_in`); on the hosted APIs' other paths, it is a
    404."""
    return dialect_of(path) is Dialect.BARE or path in NAMED_BY_HINT


def error_body(error: BucketserveError, path: str) -> dict[str, Any]:
    """`error` as the route at `path` answers errors (its dialect's form)."""
    message = brief(error.message)
    if dialect_of(path) is Dialect.BARE:
        return {"error": message, "error_type": kind_of(error), "code": error.code}
    kind = "server_error" if error.status >= 500 else "invalid_request_error"
    detail = {"code": error.code, "message": message, "type": kind, "param": error.param}
    return {"error": detail, "message": message, "detail": message}


def kind_of(error: BucketserveError) -> str:
    """text-embeddings-inference's `error_type` of `error`: what its clients show."""
    if isinstance(error, ModelNotReady):
        return "Unhealthy"
    if isinstance(error, Unavailable):  # (queue full, draining, connections: retry)
        return "Overloaded"
    return "Validation" if error.status < 500 else "Backend"


def errors(dialect: Dialect, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses of a route of `dialect`, in its form."""
    schema = dialect.error_schema
    return {status: {"model": schema, "description": WHY[status]} for status in statuses}
