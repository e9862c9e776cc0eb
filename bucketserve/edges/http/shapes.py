"""The paths several servers serve with bodies of their own: each body told apart by its fields
and handed to the route of its shape, here in one place (each route reads the body this module
read: `common.read_json` parses it once).

- `POST /predict`: ours (`sequences` or `text`), or text-embeddings-inference's
  classification (`inputs`: `tasks.classify`).
- `POST /classify`: ours (`inputs`, TEI's /predict body), or vLLM's and Infinity's
  (`input`: `pooling_api.classify`).
- `POST /rerank`: TEI's (`query`, `texts`), or Cohere's as vLLM and Infinity take it there
  (`query`, `documents`).
- `POST /` (TEI's root; `/invocations`, SageMaker's): the default model's own task, as TEI
  serves it and huggingface_hub's `InferenceClient` calls it with a server's URL: a
  similarity body (`inputs` of `source_sentence` and `sentences`), a rerank body (`query`), a
  token-classification body (Hugging Face's `parameters` of that task), else what the model
  does: embed, sparse weights, its tokens' labels or its labels.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from bucketserve.core.task import Task
from bucketserve.edges.http import cohere_api, pooling_api, predict, tasks, tei_api
from bucketserve.edges.http.common import engine_of, limits_of, read_json
from bucketserve.edges.http.task_call import post
from bucketserve.errors import MalformedRequest, TaskNotServed

router = APIRouter(tags=["Shared paths"])

Route = Callable[[Request], Awaitable[Response]]


@post(
    router,
    "/predict",
    (predict.PREDICT_BODY, tasks.ClassifyBody),
    "Run a model on sequences or texts; or a text-embeddings-inference classification",
)
async def predict_shapes(request: Request) -> Response:
    body: Any = await read_json(request, predict.budget(request))
    route = tasks.classify if isinstance(body, dict) and "inputs" in body else predict.predict
    return await route(request)


@post(
    router,
    "/classify",
    (tasks.ClassifyBody, pooling_api.InputBody),
    "Each label's score for a text or a text pair, or a batch of them (ours, TEI's body); "
    "or vLLM's and Infinity's classify (`input`)",
)
async def classify(request: Request) -> Response:
    body: Any = await read_json(request, limits_of(request).json())
    ours = not (isinstance(body, dict) and "input" in body and "inputs" not in body)
    return await (tasks.classify if ours else pooling_api.classify)(request)


@post(
    router,
    "/rerank",
    (tei_api.TeiRerankBody, cohere_api.RerankBody),
    "Rerank texts against a query: text-embeddings-inference's shape, or Cohere's",
)
async def rerank(request: Request) -> Response:
    return await rerank_route(await read_json(request, limits_of(request).json()))(request)


def rerank_route(body: Any) -> Route:
    cohere = isinstance(body, dict) and "documents" in body
    return cohere_api.rerank if cohere else tei_api.rerank_tei


ROOT_BODIES = (
    tei_api.EmbedBody,
    tei_api.SimilarityBody,
    tei_api.TeiRerankBody,
    tei_api.SparseBody,
    tasks.ClassifyBody,
    tasks.TokensBody,
)
# The parameters of Hugging Face's token-classification task, which huggingface_hub's
# `token_classification` sends (those given) in a body otherwise the same as the other tasks'
TOKEN_PARAMETERS = frozenset({"aggregation_strategy", "ignore_labels", "stride"})
# What a model at the root does, in the order TEI's root chooses (an embedding model embeds,
# a SPLADE one answers sparse weights); then the taggers and classifiers it does not serve.
ROOT_TASKS: tuple[tuple[Task, Route], ...] = (
    (Task.EMBED, tei_api.embed),
    (Task.EMBED_SPARSE, tei_api.embed_sparse),
    (Task.CLASSIFY_TOKENS, tasks.classify_tokens),
    (Task.CLASSIFY, tasks.classify),
)


async def root(request: Request) -> Response:
    """The model's own task, as TEI's root serves it."""
    body: Any = await read_json(request, limits_of(request).json())
    if isinstance(body, dict) and isinstance(body.get("inputs"), dict):
        return await tei_api.similarity(request)
    if isinstance(body, dict) and "query" in body:
        return await rerank_route(body)(request)
    parameters = body.get("parameters") if isinstance(body, dict) else None
    if isinstance(parameters, dict) and TOKEN_PARAMETERS & parameters.keys():
        return await tasks.classify_tokens(request)  # (the tagger's, whichever is the default)
    registry = engine_of(request).registry
    named = body.get("model") if isinstance(body, dict) else None
    model = registry.resolve(named if isinstance(named, str) and registry.knows(named) else None)
    for task, route in ROOT_TASKS:
        if task.value in model.info.tasks:
            try:
                return await route(request)
            except MalformedRequest as exc:  # (a body of the root's that is another task's)
                raise TaskNotServed(
                    f"the root answers model {model.name}'s own task, {task.value}, whose body "
                    f"this is not: {exc.message}",
                    param="model",
                ) from None
    raise TaskNotServed(
        f"model {model.name} serves none of the tasks of the root (embed, embed_sparse, "
        f"classify_tokens, classify); it serves {', '.join(model.info.tasks)}",
        param="model",
    )


for path in ("/", "/invocations"):
    summary = "The default model's own task, as text-embeddings-inference's root serves it"
    post(router, path, ROOT_BODIES, summary)(root)
