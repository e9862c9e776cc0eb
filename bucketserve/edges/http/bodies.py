"""What the text routes' bodies share (`tasks`, `tei_api`, `cohere_api`): a text, the
options of cutting and prompting it, texts as the core's inputs, and answers ranked by score.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, StrictBool, StrictStr

from bucketserve.core.calls import Texts
from bucketserve.core.model import Truncation
from bucketserve.edges.http.schemas import Lenient
from bucketserve.errors import InvalidInput

Text = Annotated[StrictStr, Field(min_length=1)]


class TextOptions(Lenient):
    model: StrictStr | None = Field(
        None, min_length=1, description="default: the default model, or the one that does this"
    )
    truncate: StrictBool = Field(
        False, description="cut a text longer than the model takes (else it is refused)"
    )
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        "right", description="where a text is cut: its end (right) or its start (left)"
    )
    prompt_name: StrictStr | None = Field(
        None, description="the model's prompt put before each text (its config's [prompts])"
    )

    @property
    def truncation(self) -> Truncation:
        return Truncation(self.truncate, self.truncation_direction.lower() == "left")


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
