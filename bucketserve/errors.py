"""One error hierarchy for the whole server: each error carries its HTTP status and a short code.

Errors are raised where a problem is found (config loading, validation at the edge, admission,
the runtime) and answered by the edge the request came in at: over HTTP with its status, in the
form of the route's dialect (`edges.http.dialects`); over gRPC with the status code Triton's
clients expect for it.
"""

from __future__ import annotations

import copy

MAX_MESSAGE_CHARS = 500  # what a client is told: enough to say what is wrong, never an echo


def quoted(text: object, limit: int = 64) -> str:
    """A client's string as a message shows it: quoted, and cut to `limit` characters (a
    20,000-character tensor name must not become a 20,000-character answer)."""
    shown = str(text)
    return repr(shown if len(shown) <= limit else shown[:limit] + "...")


def brief(message: str) -> str:
    """A message as a client receives it, over any protocol: at most MAX_MESSAGE_CHARS."""
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[: MAX_MESSAGE_CHARS - 3] + "..."


class BucketserveError(Exception):
    """Base class: `status` is the HTTP status, `code` a stable machine-readable name."""

    status: int = 500
    code: str = "internal"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param  # the request's field at fault, where one is (OpenAI's `param`)

    def about(self, param: str) -> BucketserveError:
        """This error, raised about the request's field `param` (the core's errors about a
        call's inputs name none: what holds them is a dialect's field). A new error: the one
        raised may be answered to others too, unchanged."""
        named = copy.copy(self)
        named.param = param
        return named


class ConfigError(BucketserveError):
    """A model config or model file is missing or wrong; raised at start, naming file and field."""

    code = "bad_config"

    @classmethod
    def at(cls, path: object, field: str, message: str) -> ConfigError:
        """`path: field: message`: the file, the field in it, and what is wrong and the fix."""
        return cls(f"{path}: {field}: {message}")


class MalformedRequest(BucketserveError):
    status = 400
    code = "malformed"


class Unauthorized(BucketserveError):
    """No API key, or not one of the server's (`--api-key`)."""

    status = 401
    code = "unauthorized"


class Forbidden(BucketserveError):
    """A valid key asking for what it may not: another tenant, by naming it in the tenant
    header."""

    status = 403
    code = "forbidden"


class ModelControlOff(BucketserveError):
    """A load or unload asked of a server started without --model-control."""

    status = 403
    code = "model_control_off"


class LoadFailed(BucketserveError):
    """A model that did not load when asked (what was served before keeps serving)."""

    status = 400
    code = "load_failed"


class ModelNotFound(BucketserveError):
    status = 404
    code = "model_not_found"


class NotFound(BucketserveError):
    """No such object (a bulk job's file or batch) for this key."""

    status = 404
    code = "not_found"


class QuotaExceeded(BucketserveError):
    """The key keeps as many files, or unfinished batches, as it may."""

    status = 429
    code = "quota_exceeded"


class InsufficientStorage(BucketserveError):
    """The server's disk could not keep what was sent (a full disk)."""

    status = 507
    code = "insufficient_storage"


class PayloadTooLarge(BucketserveError):
    status = 413
    code = "payload_too_large"


class UriTooLong(BucketserveError):
    """A request line past what a connection may buffer."""

    status = 414
    code = "uri_too_long"


class HeadersTooLarge(BucketserveError):
    """A request's head (request line and headers) past what a connection may buffer."""

    status = 431
    code = "headers_too_large"


class UnsupportedMediaType(BucketserveError):
    """A body in a content type the route does not take (a form, text/plain)."""

    status = 415
    code = "unsupported_media_type"


class InvalidInput(BucketserveError):
    status = 422
    code = "invalid_input"


class TaskNotServed(InvalidInput):
    """A task route named a model that does not do that task (the message names what it does)."""

    status = 400
    code = "task_not_served"


class Unavailable(BucketserveError):
    """Queue full, model not ready or server draining; the client should retry later."""

    status = 503
    code = "unavailable"

    def __init__(self, message: str, retry_after_s: int = 1, param: str | None = None) -> None:
        super().__init__(message, param)
        self.retry_after_s = retry_after_s


class ModelNotReady(Unavailable):
    """The model failed to load (a partial repository serves the others)."""

    code = "model_not_ready"


class DeadlineExceeded(BucketserveError):
    status = 504
    code = "deadline_exceeded"


class InferenceFailed(BucketserveError):
    """The runtime failed on a sequence run alone; only its request sees this."""

    status = 500
    code = "inference_failed"
