"""Our task routes beside the other servers' (`tei`, `cohere`, `openai`), in the shapes
Hugging Face's pipelines answer (their codecs; the table, `routes`, serves them):

- `POST /classify` (text-embeddings-inference's `/predict` body): a text, a pair, or a batch
  of them; each label's score by the `Classify` head, best first.
- `POST /classify_tokens`: each text's entities (a tagger's, NER's) by the `Classify` head
  for each token, as Hugging Face's token-classification pipeline gives them
  (`core.entities`).
- `POST /fill_mask`: each mask token's likeliest tokens, as the fill-mask pipeline gives them.

A body becomes the core's one call (`Texts` or `TextPairs`, with the task's head): admission,
deadlines, the token budget, batching by length and the API key are the core's and the app's,
as for every route. A call without a `model` goes to the default model when it serves the
task, else to the one model that does. Errors come in the one error form.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Request
from pydantic import Field, StrictBool, StrictStr

from bucketserve.core.calls import Answer, Call, Inputs, TextPairs, Texts
from bucketserve.core.labels import Activation
from bucketserve.core.tasks.classifier import SCORES, Classify, classifier_rule
from bucketserve.core.tasks.entities import ENTITIES, TagTokens
from bucketserve.core.tasks.fill_mask import GUESSES, FillMask
from bucketserve.edges.http.bodies import (
    LongInputs,
    TextOptions,
    TextsBody,
    ranked,
    refuse_prompt_for_pairs,
)
from bucketserve.edges.http.codec import Codec, reading
from bucketserve.edges.http.schemas import Lenient, Positive, Text
from bucketserve.errors import InvalidInput

TAG = "Tasks"


Item = Text | Annotated[list[Text], Field(min_length=1, max_length=2)]


class ClassifyParameters(Lenient):
    """Hugging Face's text-classification parameters, as huggingface_hub sends them."""

    top_k: Positive | None = Field(None, description="the best this many labels")
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = Field(
        None, description="sigmoid, softmax or none (the logits): default, the model's"
    )


class ClassifyBody(TextOptions):
    """text-embeddings-inference's /predict body, read as TEI reads it: a text; a pair [a, b]
    (two strings are one pair); or a batch: a list of one or three or more texts, of pairs
    [[a, b], ...], or of texts each in a list of one [[a], [b]]. With Hugging Face's
    `parameters` (its task API's body, huggingface_hub's `text_classification`), a single
    text's labels come in a list of one, as that API answers them."""

    inputs: Item | Annotated[list[Item], Field(min_length=1)]
    raw_scores: StrictBool = Field(False, description="the logits, not their scores")
    long_inputs: LongInputs | None = Field(
        None,
        description="a pair longer than the model takes: its second text whole, in windows "
        "(the first whole in each; the labels of the window scored highest), or cut",
    )
    top_k: Positive | None = Field(None, description="the best this many labels (default: all)")
    parameters: ClassifyParameters | None = None

    @property
    def best(self) -> int | None:
        """How many labels each answer holds (None: all)."""
        return self.parameters.top_k if self.parameters and self.parameters.top_k else self.top_k

    @property
    def single(self) -> bool:
        """Whether the body is one text or one pair (answered unnested), not a batch."""
        given = self.inputs
        pair = len(given) == 2 and all(isinstance(x, str) for x in given)
        return isinstance(given, str) or pair

    @property
    def items(self) -> list[list[str]]:
        """Each item of the batch (one, when `single`): a text as [text], a pair as [a, b]."""
        given = self.inputs
        if isinstance(given, str):
            return [[given]]
        if self.single:
            return [list(given)]  # type: ignore[arg-type]
        return [[item] if isinstance(item, str) else list(item) for item in given]


Aggregation = Literal["none", "simple", "first", "average", "max"]


class TokensParameters(Lenient):
    """Hugging Face's token-classification parameters, as huggingface_hub sends them."""

    aggregation_strategy: Aggregation | None = None
    ignore_labels: list[StrictStr] | None = None


class TokensBody(TextsBody):
    aggregation: Aggregation = Field(
        "none",
        description="none: each token; simple: neighbouring tokens of one entity as one; "
        "first, average, max: a word's pieces first made one, scored by its first piece, their "
        "mean or the best of them (Hugging Face's aggregation strategies)",
    )
    ignore_labels: list[StrictStr] = Field(["O"], description="entities never answered")
    parameters: TokensParameters | None = Field(
        None, description="Hugging Face's names of the two above (huggingface_hub's)"
    )

    @property
    def head(self) -> TagTokens:
        given = self.parameters or TokensParameters.model_validate({})
        aggregation = given.aggregation_strategy or self.aggregation
        ignored = self.ignore_labels if given.ignore_labels is None else given.ignore_labels
        return TagTokens(aggregation, tuple(ignored))


class FillMaskBody(TextsBody):
    top_k: Positive = Field(5, description="the likeliest this many tokens for each mask")


def classify_call(request: Request, body: ClassifyBody) -> Call:
    """/classify in our shape, TEI's /predict body."""
    texts = body.items
    if any(len(t) == 2 for t in texts) and any(len(t) == 1 for t in texts):
        raise InvalidInput("inputs: send texts, or pairs, not both in one batch")
    inputs: Inputs
    if len(texts[0]) == 2:
        refuse_prompt_for_pairs(body.prompt_name)
        inputs = TextPairs([(a, b) for a, b in texts], body.truncation, body.long_inputs)
    else:
        if body.long_inputs == "windows":
            raise InvalidInput(
                "long_inputs windows: a text is classified from one sequence; windows are "
                "for pairs (the second text whole) and embeddings",
                param="long_inputs",
            )
        inputs = Texts([t[0] for t in texts], body.truncation, body.prompt_name)
    applied = body.parameters.function_to_apply if body.parameters else None
    activation = None if applied is None else Activation(applied)
    return Call(inputs, body.model, head=Classify(body.raw_scores, activation))


def classify_json(request: Request, body: ClassifyBody, answer: Answer) -> Any:
    labels = classifier_rule(answer.model).labels
    results = [
        [{"label": labels[i], "score": float(scores[i])} for i in ranked(scores, body.best)]
        for scores in (out[SCORES] for out in answer.outputs)
    ]
    unnested = body.single and body.parameters is None
    return results[0] if unnested else results


def classify_tokens_call(request: Request, body: TokensBody) -> Call:
    if body.prompt_name is not None:  # (each entity's span is in the text as sent)
        raise InvalidInput("prompt_name: a tagger reads the texts as sent", param="prompt_name")
    return Call(body.inputs_of_texts, body.model, head=body.head)


def classify_tokens_json(request: Request, body: TokensBody, answer: Answer) -> Any:
    found = [out[ENTITIES].tolist() for out in answer.outputs]
    return found[0] if isinstance(body.inputs, str) else found


def fill_mask_call(request: Request, body: FillMaskBody) -> Call:
    return Call(body.inputs_of_texts, body.model, head=FillMask(body.top_k))


def fill_mask_json(request: Request, body: FillMaskBody, answer: Answer) -> Any:
    per_text = [out[GUESSES].tolist() for out in answer.outputs]  # (a text's masks' guesses)
    found = [masks[0] if len(masks) == 1 else masks for masks in per_text]
    return found[0] if isinstance(body.inputs, str) else found


CLASSIFY = Codec(TAG, "classify", ClassifyBody, reading(ClassifyBody), classify_call, classify_json)
CLASSIFY_TOKENS = Codec(
    TAG,
    "classify_tokens",
    TokensBody,
    reading(TokensBody),
    classify_tokens_call,
    classify_tokens_json,
)
FILL_MASK = Codec(
    TAG, "fill_mask", FillMaskBody, reading(FillMaskBody), fill_mask_call, fill_mask_json
)
