"""What the text routes' bodies share (`apis.tasks`, `apis.tei`, `apis.cohere`): a text, the
options of cutting and prompting it, texts as the core's inputs, and answers ranked by score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal, Self

import numpy as np
from pydantic import Field, StrictBool, StrictStr

from bucketserve.core.calls import Inputs, Sequences, Texts
from bucketserve.core.layout import Outputs
from bucketserve.core.model import Truncation
from bucketserve.core.tasks.classifier import WINDOW
from bucketserve.edges.http.schemas import Integer, Lenient, Text
from bucketserve.errors import InvalidInput

# vLLM's `truncate_prompt_tokens`, as its clients send it: -1 is the model's max_length, where
# a text is cut here too; a count below it would cut shorter than this server ever does, and
# is refused rather than answered for a different text.
PromptCut = Literal[-1] | None
PROMPT_CUT = Field(
    None,
    description="vLLM's: -1 only (a text is cut at the model's max_length, as `truncate` "
    "says); other counts are refused",
)


LongInputs = Literal["windows", "truncate"]
LONG_INPUTS = Field(
    None,
    description="a text longer than the model takes: embedded whole in windows of the model's "
    "length, their vectors averaged by their tokens (windows), or cut (truncate); default: "
    "the model's config (`[tokenizer] long_inputs`)",
)


class TextCut(Lenient):
    """How a request's texts are cut and prompted."""

    truncate: StrictBool | None = Field(
        None,
        description="cut a text longer than the model takes, or refuse it (422); default: the "
        "server's --auto-truncate (on unless turned off)",
    )
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        "right", description="where a text is cut: its end (right) or its start (left)"
    )
    prompt_name: StrictStr | None = Field(
        None, description="the model's prompt put before each text (its config's [prompts])"
    )
    truncate_prompt_tokens: PromptCut = PROMPT_CUT

    @property
    def truncation(self) -> Truncation:
        """How a long text is cut (`truncate` left out is the server's: `with_defaults`)."""
        return Truncation(self.truncate is not False, self.truncation_direction.lower() == "left")

    def with_defaults(self, auto_truncate: bool) -> Self:
        """The options with the server's default for what they left out."""
        if self.truncate is not None:
            return self
        return self.model_copy(update={"truncate": auto_truncate})


class TextOptions(TextCut):
    """A text route's options: its model, and how its texts are cut and prompted."""

    model: StrictStr | None = Field(
        None, min_length=1, description="default: the default model, or the one that does this"
    )


class TextsBody(TextOptions):
    """A text or texts, as text-embeddings-inference's embed routes take them."""

    inputs: Text | Annotated[list[Text], Field(min_length=1)]

    @property
    def texts(self) -> list[str]:
        return [self.inputs] if isinstance(self.inputs, str) else list(self.inputs)

    @property
    def inputs_of_texts(self) -> Texts:
        """The texts as the core's inputs, cut and prompted as the body says."""
        return Texts(self.texts, self.truncation, self.prompt_name)


Ids = Annotated[list[Integer], Field(min_length=1)]


class InputsBody(TextOptions):
    """Texts or token id lists (the model's own ids), as text-embeddings-inference's embed
    routes take them: a text, an id list, or a list of either."""

    inputs: Text | Ids | Annotated[list[Text | Ids], Field(min_length=1)]
    long_inputs: LongInputs | None = LONG_INPUTS

    def inputs_of(self, wire_bytes: int) -> Inputs:
        """The core's inputs: the texts, cut and prompted as the body says; or the id lists
        (`wire_bytes`: what they took on the wire)."""
        given = self.inputs
        items = [given] if isinstance(given, str) or isinstance(given[0], int) else list(given)
        texts = [item for item in items if isinstance(item, str)]
        if len(texts) == len(items):
            return Texts(texts, self.truncation, self.prompt_name, long_inputs=self.long_inputs)
        if texts:
            raise InvalidInput("inputs: send texts or token id lists, not both", param="inputs")
        if self.prompt_name is not None:
            raise InvalidInput("prompt_name goes before texts: send texts", param="prompt_name")
        return Sequences(items, wire_bytes)


def ranked(scores: Sequence[float] | np.ndarray, top: int | None) -> list[int]:
    """Indices by score, best first (ties in order), cut to `top`."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return order if top is None else order[:top]


def refuse_prompt_for_pairs(prompt_name: str | None) -> None:
    """A prompt goes before a text that is embedded or classified alone; a pair (a query and
    a document) is scored as sent, so a prompt named for one is refused, not ignored."""
    if prompt_name is not None:
        raise InvalidInput(
            "prompt_name: a text pair is scored as sent; a model's prompts go before single "
            "texts (embed or classify texts, not pairs, to use one)",
            param="prompt_name",
        )


def window_of(answer: Outputs) -> dict[str, Any]:
    """A document scored in windows: the characters of its best window (`window`), as the
    answers of the rerank routes add it; nothing for one scored whole."""
    if WINDOW not in answer:
        return {}
    start, end = (int(x) for x in answer[WINDOW])
    return {"window": {"start": start, "end": end}}
