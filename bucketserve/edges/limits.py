"""What one request may hold, whatever protocol brought it: built once by the process from its
settings and handed to HTTP and gRPC (`Limits`; its defaults are the default settings'), with
the budget a body is counted against before it is parsed (`Budget`). Imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

FIELDS = 64  # values beside the inputs a body may hold (a model's name, its options...)


@dataclass(frozen=True)
class Budget:
    """What a body may hold: its bytes, the steps of its sequences (what bounds its lists: a
    `[T, 1]` feature sequence is a list a step), and its values (numbers and strings; None:
    not counted)."""

    bytes: int
    steps: int
    values: int | None


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 * 2**20
    max_sequences: int = 256
    max_request_tokens: int = 65_536
    auto_truncate: bool = True  # a text past the model cut where the request does not say

    def json(self, widest_step: int = 1) -> Budget:
        """A JSON body read before its model is known: every step a request may hold at the
        widest model's step (`widest_step` numbers a step), or its texts (a pair's two each),
        and a few fields."""
        steps = self.max_request_tokens
        return Budget(self.max_body_bytes, steps, steps * widest_step + self.texts + FIELDS)

    def tensors(self, values: int | None) -> Budget:
        """A KServe v2 body, whose model is known from its path: `values`, what that model's
        inputs may hold (None: the model is not served, and the call says so)."""
        return Budget(self.max_body_bytes, self.max_request_tokens, values)

    @property
    def texts(self) -> int:
        """The strings a request may hold: its sequences', a pair's two each."""
        return 2 * self.max_sequences
