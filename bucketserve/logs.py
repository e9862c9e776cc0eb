"""Logging setup: text for people, or JSON lines for log pipelines (`--log-json`), a client's
text escaped in either so that it cannot forge a line; a throttle for what can repeat
thousands of times a minute; and request ids, which every edge gives its requests."""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:/=+-]{1,128}$")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escaped(text: str) -> str:
    """`text` with every control character written as its escape: a client's string with a
    line break in it cannot start a log line of its own."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class TextLines(logging.Formatter):
    """One line a record (its traceback aside), whatever the message holds."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802
        record.message = escaped(record.message)
        return super().formatMessage(record)


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure(level: str = "info", as_json: bool = False) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonLines() if as_json else TextLines("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def request_id(given: str | None) -> str:
    """A request's id, for its log lines and its answers: the client's own when it is safe to
    repeat (a short token: nothing a log line could be forged with), else a new one."""
    return given if given and _SAFE_ID.match(given) else uuid.uuid4().hex


class Throttled:
    """Says a repeated thing at most once every `every` seconds per kind, with how many more
    happened in between: a minute of overload must not be eleven thousand log lines."""

    def __init__(
        self,
        logger: logging.Logger,
        every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger, self._every, self._clock = logger, every, clock
        self._last: dict[str, tuple[float, int]] = {}  # kind -> (when said, held back since)

    def log(
        self,
        level: int,
        kind: str,
        message: str,
        *args: object,
        exc_info: BaseException | None = None,
    ) -> None:
        """`message % args` (and `exc_info`'s traceback), unless one of this kind was said
        less than `every` seconds ago."""
        now = self._clock()
        said, held = self._last.get(kind, (-self._every, 0))
        if now - said < self._every:
            self._last[kind] = (said, held + 1)
            return
        if held:
            message += f" (and {held} more like it in the last {now - said:.0f} s)"
        self._logger.log(level, message, *args, exc_info=exc_info)
        self._last[kind] = (now, 0)
