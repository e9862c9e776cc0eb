"""How a request that failed is answered, counted and logged: one rule for both protocols. HTTP's
exception handlers (`http.app`) and gRPC's method wrapper (`grpc.service`) hand what was raised
to `Failures` and only encode the error it gives back, each in its own form (a status and a
JSON body; a status code and a message). Imports the errors, the metrics and the logs.

The rule:
- an error of ours is answered as it says. A client's mistake (4xx) and a model that is not
  ready are counted as refusals under its code (admission counts its own: draining, queue
  full, deadline). Every one is logged at a bounded rate per code, without a traceback: a
  client's mistake at INFO, the server's refusals and failures (5xx) at WARNING;
- a client that left before its answer is no error: it is logged at INFO, at a bounded rate,
  and gets nothing (HTTP's 499 in the request metrics);
- anything else is a bug: logged at ERROR with its traceback (at a bounded rate per kind) and
  answered 500 "internal server error", its details never sent.
"""

from __future__ import annotations

import logging

from bucketserve.errors import BucketserveError, ModelNotReady
from bucketserve.logs import Throttled
from bucketserve.metrics import Metrics

log = logging.getLogger(__name__)

CLIENT_CLOSED = 499  # nginx's code for "client closed the request"; never actually delivered


class Failures:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._throttled = Throttled(log)

    def settle(self, raised: BaseException, where: str) -> BucketserveError:
        """The error to answer `raised` with, on the request `where` (a route, a method),
        counted and logged by the rule of the module docstring."""
        if not isinstance(raised, BucketserveError):
            self._throttled.log(
                logging.ERROR,
                f"bug-{type(raised).__name__}",
                "unhandled error in %s",
                where,
                exc_info=raised,
            )
            return BucketserveError("internal server error")
        if raised.status < 500 or isinstance(raised, ModelNotReady):
            self.metrics.reject(raised.code)
        level = logging.INFO if raised.status < 500 else logging.WARNING
        self._throttled.log(level, raised.code, "%s: %s", where, raised.message)
        return raised

    def client_left(self, where: str) -> None:
        self._throttled.log(
            logging.INFO, "client_gone", "%s: a client left before its answer", where
        )
