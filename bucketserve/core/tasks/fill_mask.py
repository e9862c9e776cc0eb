"""Fill-mask: a masked language model's guesses for each mask token of a text, as Hugging
Face's fill-mask pipeline gives them (for each mask, the `top_k` likeliest tokens: their
probability, id, string, and the text with the mask filled by each), so that its clients read
ours. The rule (`MaskedLM`: the output holding the logits over the vocabulary at every token,
and the tokenizer's mask id) is read at load by `loading.rules` from a model served for SPLADE
weights, whose output is exactly that. Imports the heads' protocol and the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketserve.core.heads import rule_of
from bucketserve.core.layout import Outputs, token_ids
from bucketserve.core.model import Model
from bucketserve.core.task import Task
from bucketserve.errors import InvalidInput

GUESSES = "guesses"  # what `FillMask` answers: for each mask, its guesses (a list of dicts)


@dataclass(frozen=True)
class MaskedLM:
    output: str  # logits over the vocabulary, [T, V]
    mask_id: int


@dataclass(frozen=True)
class FillMask:
    """The `top_k` likeliest tokens for each mask token of a text."""

    top_k: int = 5
    task = Task.FILL_MASK

    def outputs(self, model: Model) -> tuple[str, ...]:
        return (masked_lm_rule(model).output,)

    def admissible(self, model: Model, sequence: np.ndarray, index: int) -> None:
        mask_id = masked_lm_rule(model).mask_id
        if not (token_ids(sequence) == mask_id).any():
            raise InvalidInput(f"text {index}: no mask token to fill (write the model's mask)")

    def answer(self, model: Model, outputs: Outputs, sequence: np.ndarray) -> Outputs:
        rule = masked_lm_rule(model)
        ids = token_ids(sequence)
        masks = np.flatnonzero(ids == rule.mask_id)
        logits = np.asarray(outputs[rule.output], np.float64)
        guesses = [self._guesses(model, ids, logits[m], int(m), len(masks) == 1) for m in masks]
        return {GUESSES: np.array(guesses, dtype=object)}

    def _guesses(
        self, model: Model, ids: np.ndarray, logits: np.ndarray, at: int, single: bool
    ) -> list[dict[str, Any]]:
        probabilities = np.exp(logits - logits.max())
        probabilities /= probabilities.sum()
        best = np.argsort(-probabilities, kind="stable")[: self.top_k]
        filled = [ids.copy() for _ in best]
        for row, token in zip(filled, best, strict=True):
            row[at] = token
        texts = model.text.decode([row.tolist() for row in filled], skip_special=single)
        strings = model.text.decode([[int(t)] for t in best], skip_special=False)
        return [
            {"score": float(probabilities[t]), "token": int(t), "token_str": s, "sequence": text}
            for t, s, text in zip(best, strings, texts, strict=True)
        ]


def masked_lm_rule(model: Model) -> MaskedLM:
    rule: MaskedLM = rule_of(
        model,
        Task.FILL_MASK,
        "does not fill masks: it is no masked language model ([sparse] splade) with a mask token",
    )
    return rule
