"""The HTTP contract as strict schemas: what a request body must be, and what every answer is.

Pydantic at the edge: a body either validates (strict types: no fraction where an integer goes,
though 2.0 is 2 as JSON Schema says; no string where a boolean goes; no unknown fields) or is
refused with a 400 in the error form below. The same classes write the OpenAPI document, so the
contract and the parser are one. A body in another server's shape (`Lenient`) ignores the
fields that server ignores, and says which.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from bucketserve.edges.tensors import Datatype
from bucketserve.errors import InvalidInput, MalformedRequest

NAME = Field(min_length=1, max_length=256)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Lenient(BaseModel):
    """A body in another server's shape: strict types, and the fields that server ignores are
    ignored here too, never silently (`ignored` names them, and the answer says so)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    @property
    def ignored(self) -> list[str]:
        """The fields sent that the body does not have (a nested body's as `field.its`)."""
        nested = [
            f"{name}.{inner}"
            for name, value in self
            if isinstance(value, Lenient)
            for inner in value.ignored
        ]
        return sorted([*(self.model_extra or {}), *nested])


EMPTY = "empty_text"  # the error of an empty text: a client's invalid input (422), as elsewhere


def _not_empty(text: str) -> str:
    if not text:
        raise PydanticCustomError(EMPTY, "empty (a text holds at least one character)")
    return text


# A text a route reads: a string of at least one character. An empty one is refused as every
# route refuses it (422, as the core refuses one it is given), not as a malformed body (400).
Text = Annotated[
    StrictStr, AfterValidator(_not_empty), WithJsonSchema({"type": "string", "minLength": 1})
]


def validate(schema: type[BaseModel], body: Any, where: str) -> Any:
    """`body` as `schema`, or MalformedRequest naming the fields that are wrong (`problems`);
    InvalidInput naming the empty texts where they are all that is wrong."""
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        said = problems(exc, where)
        if _only_empty_texts(schema, body, exc):
            said = [problem for problem in said if EMPTY in problem[2]]
            message = f"{where}: " + "; ".join(f"{path}: {text}" for path, text, _ in said)
            raise InvalidInput(message, param=said[0][0].split(".")[0]) from None
        message = f"{where}: " + "; ".join(f"{path}: {text}" for path, text, _ in said)
        raise MalformedRequest(message) from None


def _only_empty_texts(schema: type[BaseModel], body: Any, exc: ValidationError) -> bool:
    """Whether `body` is refused for its empty texts alone: with each filled, it is valid. (A
    union's other forms fail too where a text is empty, so the errors alone cannot tell.)"""
    places = [e["loc"] for e in exc.errors() if e["type"] == EMPTY]
    if not places:
        return False
    filled = copy.deepcopy(body)
    try:
        for loc in places:
            *path, last = [p for p in loc if not _union_branch(p)]
            holder = filled
            for part in path:
                holder = holder[part]
            holder[last] = "-"
        schema.model_validate(filled)
    except (ValidationError, LookupError, TypeError, ValueError):  # (or a path not followed)
        return False
    return True


def problems(exc: ValidationError, where: str) -> list[tuple[str, str, set[str]]]:
    """What is wrong, as a client reads it: each field by its path in the body (not by the
    types a union tried), the likeliest first: a value that broke a bound before one of
    another type, the branch that went deepest before one that failed at once; the types a
    field could have been, together. At most three fields, each with its message and the
    kinds of error said."""
    found: dict[str, list[tuple[bool, int, str, str]]] = {}
    for error in exc.errors():
        parts = [str(p)[:32] for p in error["loc"] if not _union_branch(p)]
        kind = str(error["type"])
        ranked_as = (kind.endswith("_type"), -len(parts), error["msg"], kind)
        found.setdefault(".".join(parts) or where, []).append(ranked_as)
    ranked = sorted(found.items(), key=lambda item: min(item[1])[:2])
    said: list[tuple[str, str, set[str]]] = []
    for path, errors in ranked:
        if any(other.startswith(path + ".") for other, _, _ in said):
            continue  # (another branch of a union that went deeper already said it)
        best = min(errors)[:2]
        chosen = [(m, kind) for a_type, depth, m, kind in errors if (a_type, depth) == best]
        first, *others = dict.fromkeys(m for m, _ in chosen)
        message = " or ".join([first, *(m.removeprefix(SHOULD) for m in others)])
        said.append((path, message, {kind for _, kind in chosen}))
    return said[:3]


SHOULD = "Input should be "


def _union_branch(part: str | int) -> bool:
    """Whether a part of an error's path names a type a union tried, not a field: pydantic's
    tags (`constrained-str`, `list[...]`, `function-before[...]`, a class's name)."""
    if isinstance(part, int):
        return False
    return (
        "[" in part
        or part[:1].isupper()
        or part.startswith(("constrained-", "function-"))
        or (part in ("str", "int", "float", "bool", "dict", "list", "none"))
    )


# -- errors ---------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    """An error on the bare paths and KServe v2's: text-embeddings-inference's form (and
    KServe's: its `error`), with our code."""

    error: str = Field(description="what is wrong, for people")
    error_type: Literal["Validation", "Overloaded", "Unhealthy", "Backend"] = Field(
        description="text-embeddings-inference's kind of error"
    )
    code: str = Field(description="stable machine-readable name, e.g. invalid_input")


class HostedErrorDetail(BaseModel):
    code: str = Field(description="stable machine-readable name, e.g. invalid_input")
    message: str = Field(description="what is wrong, for people")
    type: Literal["invalid_request_error", "server_error"]
    param: str | None = Field(description="the field at fault, where there is one")


class HostedError(BaseModel):
    """An error on the hosted APIs' paths: OpenAI's form, with Cohere's `message` and Jina's
    `detail` beside it."""

    error: HostedErrorDetail
    message: str
    detail: str


# -- KServe v2 ------------------------------------------------------------------------------


def is_integer(value: Any) -> bool:
    """An integer as JSON Schema reads one: a number with no fraction (2.0 is 2), not a bool."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _integral(value: Any) -> Any:
    """A JSON number with no fraction is accepted where an integer goes. Any other value is
    left for the strict check to refuse."""
    return int(value) if isinstance(value, float) and is_integer(value) else value


Integer = Annotated[int, BeforeValidator(_integral)]
Count = Annotated[int, Field(ge=0), BeforeValidator(_integral)]
Positive = Annotated[int, Field(ge=1), BeforeValidator(_integral)]


class TensorParameters(Strict):
    binary_data_size: Count | None = Field(
        None, description="the tensor's bytes follow the JSON header, in order"
    )


class InputTensor(Strict):
    name: str = NAME
    shape: list[Count] = Field(max_length=8)
    datatype: Datatype
    parameters: TensorParameters | None = None
    data: list[Any] | None = Field(None, description="row-major values, flat or nested")


class OutputParameters(Strict):
    binary_data: bool | None = Field(None, description="send this output as binary")


class RequestedOutput(Strict):
    name: str = NAME
    parameters: OutputParameters | None = None


class RequestParameters(Strict):
    """Triton's request parameters (`bucketserve.edges.kserve.PARAMETERS`)."""

    binary_data_output: bool | None = Field(None, description="every output as binary")
    timeout: Count | None = Field(
        None,
        description="microseconds (Triton's): shortens the request's deadline; 0 (Triton's "
        "default) sets none of its own",
    )
    priority: Count | None = Field(
        None, description="its priority level: 1 first; 0 (Triton's default) or none, the default"
    )
    truncate: bool | None = Field(
        None, description="`text`: cut one longer than the model takes (default), or refuse it"
    )
    truncation_direction: Literal["right", "left"] | None = Field(
        None, description="`text`: where one is cut, its end (right) or its start (left)"
    )


class InferRequest(Strict):
    """A KServe v2 inference request's JSON (the binary tensor extension's header)."""

    id: str | None = Field(None, max_length=256)
    model_name: str | None = Field(
        None, max_length=256, description="as KServe's clients send it: the path's model"
    )
    model_version: str | None = Field(
        None, max_length=32, description="as KServe's clients send it: the path's version"
    )
    inputs: list[InputTensor] = Field(min_length=1, max_length=16)
    outputs: list[RequestedOutput] | None = Field(None, max_length=16)
    parameters: RequestParameters | None = None


class OutputTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = None
    parameters: dict[str, int] | None = Field(None, description="binary_data_size, if binary")


class InferResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[OutputTensor]


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


class ModelReady(BaseModel):
    name: str
    ready: bool
    error: str | None = Field(None, description="why the model did not load")


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]
    default_model: str | None = Field(None, description="the model /predict serves by default")


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1 on the batch and time axes")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    fingerprint: str = Field(
        description="this version's fingerprint: the digest of what makes its answers"
    )


class IndexEntry(BaseModel):
    name: str
    state: str = Field(description="READY, or UNAVAILABLE when it did not load")
    version: str | None = None
    reason: str | None = None


# -- documented answers, by status -------------------------------------------------------------

WHY = {
    400: "malformed body, header or parameter; a model that did not load when asked",
    403: "model control is off (load and unload need --model-control); a key naming a "
    "tenant it may not",
    404: "no such model, version or route",
    413: "body too large",
    415: "a body that is not JSON (v2: or binary tensors)",
    422: "invalid input: a value or shape the model cannot take",
    429: "the key keeps as many files, or unfinished batches, as it may",
    503: "queue full, draining, or the model did not load (Retry-After says when to retry)",
    504: "the deadline passed",
    507: "the server's disk could not keep the file",
}


def inlined(schema: type[BaseModel]) -> dict[str, Any]:
    """`schema`'s JSON schema with its definitions written in place: a body the route reads
    itself (binary tensors follow the JSON) is documented through `openapi_extra`, where
    references into the model's own `$defs` would point nowhere."""
    document = schema.model_json_schema()
    definitions = document.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return resolve(definitions[ref.removeprefix("#/$defs/")])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(value) for value in node]
        return node

    resolved: dict[str, Any] = resolve(document)
    return resolved
