"""The table of dialects: every path the vendors' APIs are served at, in the document's order,
each with the routes that take its bodies (a dialect, a vendor's codec from `apis`, and when
a body is that route's) or the page it serves (`table` says how rows are run and
registered). The app registers each path once from here, and the OpenAPI document's bodies
are its rows'.

Where several servers' bodies share a path, the body's own fields tell them apart, here and
nowhere else:

- `POST /predict`: ours (`sequences` or `text`), or text-embeddings-inference's
  classification (`inputs`).
- `POST /classify`: ours (`inputs`, TEI's /predict body), or vLLM's and Infinity's (`input`;
  Infinity's with its `raw_scores`).
- `POST /rerank`: TEI's (`query`, `texts`), or Cohere's as vLLM and Infinity take it there
  (`query`, `documents`; Infinity's with its `raw_scores`), as at Cohere's own paths.
- `POST /` (TEI's root; `/invocations`, SageMaker's): the default model's own task, as TEI
  serves it and huggingface_hub's `InferenceClient` calls it with a server's URL: a
  similarity body (`inputs` of `source_sentence` and `sentences`), a rerank body (`query`), a
  token-classification body (Hugging Face's `parameters` of that task), else what the model
  does: embed, sparse weights, its tokens' labels or its labels.

Every path's dialect answers its errors (`form_of`), paths of no row by their prefix; a
path's row says whether a batch may run it (`batch`, `ENDPOINTS`). A new vendor's API is its
module in `apis` and its rows here; only this module imports `apis`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from bucketserve.core.model import Model
from bucketserve.core.task import Task
from bucketserve.edges.http.apis import cohere, openai, pooling, predict, tasks, tei
from bucketserve.edges.http.codec import Codec
from bucketserve.edges.http.common import engine_of
from bucketserve.edges.http.dialects import BARE, HOSTED, HOSTED_BY_MANY, OWN, Dialect, Form
from bucketserve.edges.http.table import Get, Misread, Path, Route, Row, When, always, batchable
from bucketserve.errors import BucketserveError, MalformedRequest, TaskNotServed

SHARED = "Shared paths"  # the tag of a path several servers' bodies share

# -- what a body says it is --------------------------------------------------------------------


def has(field: str) -> When:
    def holds(body: Any, request: Request) -> bool:
        return isinstance(body, dict) and field in body

    return holds


def lacks(field: str) -> When:
    def holds(body: Any, request: Request) -> bool:
        return not (isinstance(body, dict) and field in body)

    return holds


def infinity(body: Any, request: Request) -> bool:
    """Infinity's body: its `raw_scores` given (`null` is none given)."""
    return isinstance(body, dict) and body.get("raw_scores") is not None


def every(*conditions: When) -> When:
    def holds(body: Any, request: Request) -> bool:
        return all(condition(body, request) for condition in conditions)

    return holds


def negated(condition: When) -> When:
    def holds(body: Any, request: Request) -> bool:
        return not condition(body, request)

    return holds


def cohere_rerank(dialect: Dialect, when: When = always) -> tuple[Route, Route]:
    """Cohere's and Jina's rerank body (where `when` holds), and Infinity's: the same, with
    its `raw_scores`."""
    return (
        Route(dialect, cohere.RERANK, every(when, negated(infinity))),
        Route(dialect, cohere.INFINITY_RERANK, every(when, infinity)),
    )


# vLLM's and Infinity's /classify body: `input`, not our `inputs`
VLLM_CLASSIFY = every(has("input"), lacks("inputs"))

# -- the root: what a body says, else the model's own task ------------------------------------


def similarity(body: Any, request: Request) -> bool:
    return isinstance(body, dict) and isinstance(body.get("inputs"), dict)


# The parameters of Hugging Face's token-classification task, which huggingface_hub's
# `token_classification` sends (those given) in a body otherwise the same as the other tasks'
TOKEN_PARAMETERS = frozenset({"aggregation_strategy", "ignore_labels", "stride"})


def token_parameters(body: Any, request: Request) -> bool:
    parameters = body.get("parameters") if isinstance(body, dict) else None
    return isinstance(parameters, dict) and bool(TOKEN_PARAMETERS & parameters.keys())


QUERY = every(negated(similarity), has("query"))
TOKENS = every(negated(similarity), lacks("query"), token_parameters)
SAYS_NOTHING = every(negated(similarity), lacks("query"), negated(token_parameters))

# What a model at the root does, in the order TEI's root chooses (an embedding model embeds,
# a SPLADE one answers sparse weights); then the taggers and classifiers it does not serve.
ROOT_TASKS = (Task.EMBED, Task.EMBED_SPARSE, Task.CLASSIFY_TOKENS, Task.CLASSIFY)
ROOT_MODEL = "root_model"  # a request state's key: the model the root answers for


def root_model(body: Any, request: Request) -> Model:
    """The model the root answers for: the one the body names, if it is served, else the
    default (found once a request)."""
    state = request.state
    if not hasattr(state, ROOT_MODEL):
        registry = engine_of(request).registry
        named = body.get("model") if isinstance(body, dict) else None
        known = isinstance(named, str) and registry.knows(named)
        setattr(state, ROOT_MODEL, registry.resolve(named if known else None))
    model: Model = getattr(state, ROOT_MODEL)
    return model


def own_task(task: Task) -> When:
    """A body that says nothing of what it is, at the root of a model whose own task (the
    first of `ROOT_TASKS` it serves) is `task`."""

    def holds(body: Any, request: Request) -> bool:
        if not SAYS_NOTHING(body, request):
            return False
        served = root_model(body, request).info.tasks
        return next((t for t in ROOT_TASKS if t.value in served), None) is task

    return holds


def not_its_body(task: Task) -> Misread:
    """At the root, a malformed body is one of another task's: the model's own is `task`."""

    def misread(exc: MalformedRequest, body: Any, request: Request) -> BucketserveError:
        model = root_model(body, request)
        return TaskNotServed(
            f"the root answers model {model.name}'s own task, {task.value}, whose body "
            f"this is not: {exc.message}",
            param="model",
        )

    return misread


def serves_none(body: Any, request: Request) -> BucketserveError:
    model = root_model(body, request)
    return TaskNotServed(
        f"model {model.name} serves none of the tasks of the root (embed, embed_sparse, "
        f"classify_tokens, classify); it serves {', '.join(model.info.tasks)}",
        param="model",
    )


def by_task(task: Task, codec: Codec[Any]) -> Route:
    return Route(BARE, codec, own_task(task), misread=not_its_body(task))


ROOT_COHERE = every(QUERY, has("documents"))  # (taken at the root; its documented bodies are TEI's)
ROOT = (
    by_task(Task.EMBED, tei.EMBED),
    Route(BARE, tei.SIMILARITY, similarity),
    Route(BARE, tei.RERANK, every(QUERY, lacks("documents"))),
    *(Route(r.dialect, r.codec, r.when, False) for r in cohere_rerank(BARE, ROOT_COHERE)),
    by_task(Task.EMBED_SPARSE, tei.EMBED_SPARSE),
    by_task(Task.CLASSIFY, tasks.CLASSIFY),
    Route(BARE, tasks.CLASSIFY_TOKENS, TOKENS),
    by_task(Task.CLASSIFY_TOKENS, tasks.CLASSIFY_TOKENS),
)
ROOT_SUMMARY = "The default model's own task, as text-embeddings-inference's root serves it"
ROOT_ABOUT = "The model's own task, as TEI's root serves it."

# -- the table ---------------------------------------------------------------------------------


def rerank_at(path: str, batch: int) -> Path:
    summary = f"Rerank documents against a query (Cohere's and Jina's shape), at {path}"
    return Path(path, summary, cohere_rerank(HOSTED), batch=batch)


def one(
    path: str, summary: str, dialect: Dialect, codec: Codec[Any], batch: int | None = None
) -> Path:
    """A path of one vendor's one body (`batch`: where a batch may run it, `Path.batch`)."""
    return Path(path, summary, (Route(dialect, codec),), batch=batch)


EMBEDDINGS = "Embeddings, as OpenAI's API answers them"
SCORE = "Scores of text pairs, as vLLM's /score answers them"

ROWS: tuple[Row, ...] = (
    # OpenAI's, under /v1 as OpenAI serves them and at the root as TEI and Infinity serve them
    one("/v1/embeddings", EMBEDDINGS, HOSTED_BY_MANY, openai.EMBEDDINGS, batch=1),
    Get("/v1/models", HOSTED, openai.MODELS),
    Get("/v1/models/{name}", HOSTED, openai.MODEL),
    one("/embeddings", EMBEDDINGS, HOSTED_BY_MANY, openai.EMBEDDINGS, batch=2),
    Get("/models", HOSTED, openai.MODELS),
    Get("/models/{name}", HOSTED, openai.MODEL),
    # vLLM's
    one("/score", SCORE, HOSTED, pooling.SCORE, batch=14),
    one("/v1/score", "As /score", HOSTED, pooling.SCORE, batch=13),
    # ours
    one(
        "/classify_tokens",
        "Each text's entities: labels, scores and character spans of its tokens",
        BARE,
        tasks.CLASSIFY_TOKENS,
        batch=9,
    ),
    one(
        "/fill_mask",
        "Each mask token's likeliest tokens, as Hugging Face's fill-mask pipeline gives them",
        BARE,
        tasks.FILL_MASK,
    ),
    # text-embeddings-inference's
    one(
        "/embed_sparse",
        "Each text's sparse weights over the vocabulary: [{index, value}]",
        BARE,
        tei.EMBED_SPARSE,
        batch=12,
    ),
    one("/embed_all", "One vector per token of each text", BARE, tei.EMBED_ALL, batch=11),
    one(
        "/embed",
        "One vector per text, pooled as the model's config says",
        BARE,
        tei.EMBED,
        batch=10,
    ),
    one(
        "/similarity",
        "The cosine similarity of a sentence to each of others (sentence-similarity)",
        BARE,
        tei.SIMILARITY,
    ),
    one(
        "/tokenize",
        "Tokens of each text, by the model's own tokenizer: ids, pieces, offsets",
        BARE,
        tei.TOKENIZE,
    ),
    one("/decode", "Texts of token id lists, by the model's own tokenizer", BARE, tei.DECODE),
    Get("/health", BARE, tei.HEALTH),
    Get("/", BARE, tei.HEALTH_TOO),
    Get("/ping", BARE, tei.HEALTH_TOO),
    Get("/info", BARE, tei.INFO),
    # Cohere's, and Jina's rerank
    one("/v1/embed", "Embeddings (v1)", HOSTED, cohere.EMBED_V1, batch=6),
    one("/v2/embed", "Embeddings (v2)", HOSTED, cohere.EMBED_V2, batch=7),
    rerank_at("/v1/rerank", batch=3),
    rerank_at("/v2/rerank", batch=5),
    # the paths several servers share
    Path(
        "/predict",
        "Run a model on sequences or texts; or a text-embeddings-inference classification",
        (Route(OWN, predict.PREDICT, lacks("inputs")), Route(BARE, tasks.CLASSIFY, has("inputs"))),
        SHARED,
        "predict_shapes",
        batch=15,
    ),
    Path(
        "/classify",
        "Each label's score for a text or a text pair, or a batch of them (ours, TEI's body); "
        "or vLLM's and Infinity's classify (`input`)",
        (
            Route(BARE, tasks.CLASSIFY, negated(VLLM_CLASSIFY)),
            Route(BARE, pooling.CLASSIFY, every(VLLM_CLASSIFY, negated(infinity))),
            Route(BARE, pooling.INFINITY_CLASSIFY, every(VLLM_CLASSIFY, infinity)),
        ),
        SHARED,
        "classify",
        batch=8,
    ),
    Path(
        "/rerank",
        "Rerank texts against a query: text-embeddings-inference's shape, or Cohere's",
        (Route(BARE, tei.RERANK, lacks("documents")), *cohere_rerank(BARE, has("documents"))),
        SHARED,
        "rerank",
        batch=4,
    ),
    Path("/", ROOT_SUMMARY, ROOT, SHARED, "root", ROOT_ABOUT, serves_none),
    Path("/invocations", ROOT_SUMMARY, ROOT, SHARED, "root", ROOT_ABOUT, serves_none),
)

# The routes a batch may run (`batch=` above), in the order the Batch API lists them
ENDPOINTS = tuple(path.path for path in batchable(ROWS))

# -- each path's dialect ---------------------------------------------------------------------

# Paths under a hosted API's prefix answer in its form, a route there or not (`/v1/nope`)
PREFIXES = (("/v1/", Form.HOSTED), ("/models/", Form.HOSTED))
FORMS = {row.path: row.form if isinstance(row, Path) else row.dialect.form for row in ROWS}


def form_of(path: str) -> Form:
    """How errors are answered at `path`: its row's dialect's form, else its prefix's, else
    bare (TEI's, KServe v2's)."""
    form = FORMS.get(path)
    if form is not None:
        return form
    return next((f for prefix, f in PREFIXES if path.startswith(prefix)), Form.BARE)


def error_body(error: BucketserveError, path: str) -> dict[str, Any]:
    """`error` as the route at `path` answers errors (its dialect's form)."""
    return form_of(path).body(error)
