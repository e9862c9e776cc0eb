"""The dialects the HTTP edge speaks: how a route answers an error (its `Form`) and whether
it reads a body's model name as a hint (`Dialect`). Which dialect each path speaks is the
table's (`routes`); every error body is written here, by form (the routes, the app's handlers,
the key guard and the connection that refuses a body before the app sees it all ask the
table, which asks this). Each form holds the keys its clients read, and our code:

- `Form.BARE`: the paths without a prefix (text-embeddings-inference's and ours beside them)
  and KServe v2's: `{"error": message, "error_type": kind, "code": code}`, TEI's
  `ErrorResponse`, which huggingface_hub, Haystack and LangChain read, and KServe's
  `{"error": message}`, which tritonclient and KServe's clients read.
- `Form.HOSTED`: the paths of the hosted APIs (OpenAI's `/v1/...`, Cohere's and Jina's, and
  the copies TEI, vLLM and Infinity serve: `/embeddings`, `/models`, `/score`, Cohere's two
  under `/v2`): OpenAI's `{"error": {"message", "type", "param", "code"}}`, which its SDKs
  read, with Cohere's `message` and Jina's `detail` beside it (Jina's clients raise
  `KeyError` without).

Imports the errors and the schemas that document each form.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel

from bucketserve.edges.http.schemas import WHY, ErrorBody, HostedError
from bucketserve.errors import BucketserveError, ModelNotReady, Unavailable, brief


class Form(Enum):
    """How a route answers an error."""

    BARE = "bare"
    HOSTED = "hosted"

    @property
    def error_schema(self) -> type[BaseModel]:
        """The schema of its error answers, for the OpenAPI document."""
        return HostedError if self is Form.HOSTED else ErrorBody

    def body(self, error: BucketserveError) -> dict[str, Any]:
        """`error` in this form."""
        message = brief(error.message)
        if self is Form.BARE:
            return {"error": message, "error_type": kind_of(error), "code": error.code}
        kind = "server_error" if error.status >= 500 else "invalid_request_error"
        detail = {"code": error.code, "message": message, "type": kind, "param": error.param}
        return {"error": detail, "message": message, "detail": message}


@dataclass(frozen=True)
class Dialect:
    """How the routes of a family of paths answer: their errors' form, and whether a body's
    model name is a hint. Where it is (TEI serves one model; Infinity's clients send
    `default/not-specified`), a name none answers to goes to the one model that serves the
    task (`Call.stand_in`); elsewhere it is a 404."""

    name: str
    form: Form
    names_are_hints: bool


# The paths without a prefix: TEI's, ours beside them, and the other servers' bodies there
BARE = Dialect("bare", Form.BARE, names_are_hints=True)
# Our own /predict body and KServe v2's: bare errors, exact names
OWN = Dialect("own", Form.BARE, names_are_hints=False)
# The hosted APIs' paths: OpenAI's, Cohere's, Jina's and the copies of them vLLM serves
HOSTED = Dialect("hosted", Form.HOSTED, names_are_hints=False)
# OpenAI's embeddings route, which TEI and Infinity serve too (and their clients call)
HOSTED_BY_MANY = Dialect("hosted, by many", Form.HOSTED, names_are_hints=True)


def kind_of(error: BucketserveError) -> str:
    """text-embeddings-inference's `error_type` of `error`: what its clients show."""
    if isinstance(error, ModelNotReady):
        return "Unhealthy"
    if isinstance(error, Unavailable):  # (queue full, draining, connections: retry)
        return "Overloaded"
    return "Validation" if error.status < 500 else "Backend"


def errors(dialect: Dialect, *statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses of a route of `dialect`, in its form."""
    schema = dialect.form.error_schema
    return {status: {"model": schema, "description": WHY[status]} for status in statuses}
