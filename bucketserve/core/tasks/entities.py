"""Token classification: a tagger's scores for each token of a text, by its
`[token_classifier]` (a `labels.Classifier`: the rule of `Task.CLASSIFY_TOKENS`), made into
what a tagger's client reads: the text's entities, as Hugging Face's token-classification
pipeline gives them, so its users' code reads ours. The `TagTokens` head reads the text's
own tokens (their strings and spans), as the core encoded it for the model: nothing tokenises
it twice; it answers in the worker, as every head does.

- `none`: each token but the special ones, its best label, that label's score, its index in
  the text's tokens, its own string and character span.
- `simple`: neighbouring tokens of one entity type (`B-PER` then `I-PER`s, or one label
  repeated) made one entity, its score their mean and its word their text; a `B-` starts a
  new one.
- `first`, `average`, `max`: a word's pieces (`##`-continued) first made one entity, its
  label and score from its first piece's scores, their mean, or the piece scored highest;
  then words grouped as `simple` groups tokens. A word never splits between entities.

Either way entities labelled as `ignore` (by default `O`, outside any entity) are left out.
Imports the heads' protocol, the labels' rule and the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bucketserve.core.heads import rule_of
from bucketserve.core.labels import Classifier
from bucketserve.core.layout import Outputs
from bucketserve.core.model import Model
from bucketserve.core.task import Task

IGNORED = ("O",)
ENTITIES = "entities"  # what `TagTokens` answers: the text's entities, a list of dicts


WORDS = ("first", "average", "max")  # the aggregations that make a word of its pieces


def token_entities(
    scores: np.ndarray, tokens: Sequence[dict[str, Any]], labels: Sequence[str]
) -> list[dict[str, Any]]:
    """Every non-special token's best label and score ([T, labels] `scores`, one row a token)."""
    best = scores.argmax(axis=-1)
    return [
        {
            "entity": labels[int(best[i])],
            "score": float(scores[i, best[i]]),
            "index": i,
            "word": token["piece"],
            "start": token["start"],
            "end": token["stop"],
        }
        for i, token in enumerate(tokens)
        if not token["special"]
    ]


def word_entities(
    scores: np.ndarray,
    tokens: Sequence[dict[str, Any]],
    labels: Sequence[str],
    aggregation: str,
    join: Callable[[Sequence[str]], str],
) -> list[dict[str, Any]]:
    """Each word's entity: its pieces (a token whose string is not as long as the text it
    covers continues the word before, as a `##` piece does) scored by `aggregation`."""
    words: list[list[int]] = []
    for i, token in enumerate(tokens):
        if token["special"]:
            continue
        piece = len(token["piece"]) != token["stop"] - token["start"]
        if words and piece:
            words[-1].append(i)
        else:
            words.append([i])
    found = []
    for word in words:
        if aggregation == "first":
            row = scores[word[0]]
        elif aggregation == "max":
            row = scores[max(word, key=lambda i: scores[i].max())]
        else:
            row = scores[word].mean(axis=0)
        best = int(row.argmax())
        found.append(
            {
                "entity": labels[best],
                "score": float(row[best]),
                "word": join([tokens[i]["piece"] for i in word]),
                "start": tokens[word[0]]["start"],
                "end": tokens[word[-1]]["stop"],
            }
        )
    return found


def _kind(label: str) -> tuple[str, str]:
    """(B or I, the entity type) of a label; one without a prefix continues its type."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def grouped(
    entities: Sequence[dict[str, Any]], join: Callable[[Sequence[str]], str]
) -> list[dict[str, Any]]:
    """Neighbouring token entities of one type, each group one entity (`join` makes a word of
    token strings)."""
    groups: list[list[dict[str, Any]]] = []
    for entity in entities:
        bi, kind = _kind(entity["entity"])
        if groups and bi != "B" and _kind(groups[-1][-1]["entity"])[1] == kind:
            groups[-1].append(entity)
        else:
            groups.append([entity])
    return [
        {
            "entity_group": group[0]["entity"].split("-", 1)[-1],
            "score": float(np.mean([e["score"] for e in group])),
            "word": join([e["word"] for e in group]),
            "start": group[0]["start"],
            "end": group[-1]["end"],
        }
        for group in groups
    ]


def entities(
    scores: np.ndarray,
    tokens: Sequence[dict[str, Any]],
    labels: Sequence[str],
    aggregation: str,
    join: Callable[[Sequence[str]], str],
    ignore: Sequence[str] = IGNORED,
) -> list[dict[str, Any]]:
    """A text's entities by `aggregation` (none, simple, first, average, max), those labelled
    `ignore` left out."""
    if aggregation in WORDS:
        found = word_entities(scores, tokens, labels, aggregation, join)
    else:
        found = token_entities(scores, tokens, labels)
    if aggregation == "none":
        return [e for e in found if e["entity"] not in ignore]
    return [e for e in grouped(found, join) if e["entity_group"] not in ignore]


@dataclass(frozen=True)
class TagTokens:
    """A text's entities by `aggregation`, those labelled in `ignore` left out. It reads the
    text's own tokens (`reads_text`): an answer is the text's, not only its ids'."""

    aggregation: str = "none"
    ignore: tuple[str, ...] = IGNORED
    task = Task.CLASSIFY_TOKENS
    reads_text = True

    def outputs(self, model: Model) -> tuple[str, ...]:
        return (token_classifier_rule(model).output,)

    def answer(
        self,
        model: Model,
        outputs: Outputs,
        sequence: np.ndarray,
        tokens: Sequence[dict[str, Any]] = (),
    ) -> Outputs:
        rule = token_classifier_rule(model)
        scores = rule.scores(outputs[rule.output])
        found = entities(
            scores, tokens, rule.labels, self.aggregation, model.text.joined, self.ignore
        )
        return {ENTITIES: np.array(found, dtype=object)}  # (the entities, as they are)


def token_classifier_rule(model: Model) -> Classifier:
    rule: Classifier = rule_of(
        model,
        Task.CLASSIFY_TOKENS,
        "does not classify tokens: its config has no [token_classifier]",
    )
    return rule
