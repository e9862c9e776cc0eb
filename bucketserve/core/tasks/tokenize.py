"""The tokenizer alone: a text's tokens (`Tokenize`) and token ids' text (`Decode`), by the
model's own tokenizer, for a model whose config names one (the rule of `Task.TOKENIZE`).
These heads run no model: the engine admits their call as it admits any (a drain refuses it,
the request's limits apply, the drain counts it) and answers it without a batch. Imports the
heads' protocol and the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketserve.core.heads import rule_of
from bucketserve.core.layout import Outputs
from bucketserve.core.model import TRUNCATE, Model, Truncation
from bucketserve.core.task import Task

TOKENS = "tokens"  # what `Tokenize` answers for a text: its tokens, a list of dicts
TEXT = "text"  # what `Decode` answers for an id list: its text


@dataclass(frozen=True)
class IdRows:
    """Token id lists, as a client sent them (to decode: not sequences the model runs)."""

    rows: Sequence[Sequence[int]]

    def count(self, model: Model) -> int:
        return len(self.rows)

    @property
    def heavy(self) -> bool:
        return False

    def sequences(self, model: Model) -> list[np.ndarray]:
        raise AssertionError("id rows are decoded, never run")  # (`Decode` runs no model)


@dataclass(frozen=True)
class Tokenize:
    """Each text's tokens: ids, pieces, spans (`Model.tokens`); `special`: with the special
    tokens the tokenizer frames a text with."""

    special: bool = True
    task = Task.TOKENIZE
    runs_model = False

    def outputs(self, model: Model) -> tuple[str, ...]:
        tokenizer_rule(model)
        return ()

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        raise AssertionError("the tokenizer alone runs no model")  # (answer_all answers)

    def answer_all(self, model: Model, inputs: Any) -> list[Outputs]:
        texts: Sequence[str] = inputs.texts
        truncation: Truncation = getattr(inputs, "truncation", TRUNCATE)
        tokens = model.text.tokens(texts, self.special, truncation)
        return [{TOKENS: np.array(t, dtype=object)} for t in tokens]


@dataclass(frozen=True)
class Decode:
    """Each id list's text; `skip_special`: without the special tokens."""

    skip_special: bool = True
    task = Task.TOKENIZE
    runs_model = False

    def outputs(self, model: Model) -> tuple[str, ...]:
        tokenizer_rule(model)
        return ()

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        raise AssertionError("the tokenizer alone runs no model")  # (answer_all answers)

    def answer_all(self, model: Model, inputs: Any) -> list[Outputs]:
        texts = model.text.decode(inputs.rows, self.skip_special)
        return [{TEXT: np.array(text, dtype=object)} for text in texts]


def tokenizer_rule(model: Model) -> bool:
    """The model's tokenizer rule (its tokenizer, run alone: True), or InvalidInput."""
    return bool(rule_of(model, Task.TOKENIZE, "has no tokenizer"))
