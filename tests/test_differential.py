"""The differential suite: every text route's answers against the reference libraries, on
generated inputs that cross every limit.

The server runs the task exports (`tests.task_exports`) with texts cut to a window of 160
characters before tokenising, so that most inputs cross it; the references run each text (or
pair) alone, whole, through transformers' own tokenizer with the truncation the request asks
(its side, its length), then the model alone at batch 1, unpadded: the ONNX embedder through
ONNX Runtime and sentence-transformers' pooling, written apart in `tests.exports`; the
classifiers, the tagger and the masked LM through transformers (its pipelines for label
scores and entities). Inputs are drawn by Hypothesis with a fixed seed: words of the
vocabulary and outside it, long words, unicode edge cases, lengths across `max_chars`,
`max_length` and the bucket edges, both truncation sides, `truncate` off, pairs whose parts
each overflow, lists of one, two, three and many, prompts. The fast tier draws a few dozen
inputs a route; the slow tier ten times as many. A request the reference says the model
cannot take (too long with `truncate` off) must be a 422; every other answer must equal the
reference's.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import threading
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bucketserve.loading import load_engine
from bucketserve.runtime.sessions import GraphFile, side_session
from bucketserve.settings import Settings
from tests.engines import serving
from tests.exports import SPECIALS, WORDS, pooled_reference, tokenizer, vocabulary
from tests.task_exports import SENTIMENT, TaskRepository

CHARS = 160  # the characters the server reads of a text uncut: most inputs below cross it
TOLERANCE = 1e-5
EXAMPLES = {"fast": 20, "slow": 200}
TIERS = [pytest.param("fast"), pytest.param("slow", marks=pytest.mark.slow)]

pytestmark = pytest.mark.timeout(900)

# words as users write them, and the edge cases of unicode and tokenisation
PIECES = [
    *WORDS,
    "bucketserve",
    "zebra",
    "quixotic",
    "supercalifragilistic" * 6,  # past WordPiece's longest word: one [UNK]
    "naïve",
    "cafe\u0301",
    "日本語",
    "😀",
    "\u200b",
    "don't",
    "U.S.A.",
    "3.14",
    "ﬁne",
]
separators = st.sampled_from([" ", " ", " ", " ", "  ", "\n", ", ", ". ", "\t"])
text = st.lists(st.tuples(st.sampled_from(PIECES), separators), min_size=1, max_size=90).map(
    lambda parts: "".join("".join(p) for p in parts).strip() or "a"
)
texts = st.lists(text, min_size=1, max_size=6)
sides = st.sampled_from(["right", "left"])


class App:
    """The server in-process, its event loop in a thread of its own, asked from sync code (a
    Hypothesis test) one request at a time."""

    def __init__(self, models: Path, **given: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready: Future[httpx.AsyncClient] = Future()
        self._stop = asyncio.Event()
        self._given = given  # (settings beside the suite's own)
        self._thread = threading.Thread(target=self._run, args=(models,), daemon=True)
        self._thread.start()
        self.client = self._ready.result(timeout=300)
        self.counts: Counter[str] = Counter()

    def _run(self, models: Path) -> None:
        async def main() -> None:
            engine = load_engine(Settings(models=models, max_sequences=64, **self._given))
            async with serving(engine) as client:
                self._ready.set_result(client)
                await self._stop.wait()

        try:
            self._loop.run_until_complete(main())
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)

    def post(self, path: str, body: dict[str, Any], count: int = 1) -> httpx.Response:
        """POST `body`, counting `count` inputs for `path` in the suite's tally."""
        self.counts[path] += count
        done = asyncio.run_coroutine_threadsafe(self.client.post(path, json=body), self._loop)
        return done.result(timeout=300)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=60)
        self._loop.close()


@pytest.fixture(scope="module")
def task_models(task_repository: TaskRepository, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The task exports, their texts cut at CHARS characters."""
    models = tmp_path_factory.mktemp("differential") / "models"
    shutil.copytree(task_repository.models, models)
    for config in models.glob("*/config.toml"):
        text = config.read_text()
        config.write_text(text.replace("[tokenizer]\n", f"[tokenizer]\nmax_chars = {CHARS}\n"))
    return models


@pytest.fixture(scope="module")
def app(task_models: Path) -> Iterator[App]:
    """The task exports served as the server starts by default; the inputs each route was
    sent are printed at the end (pytest -s)."""
    served = App(task_models)
    yield served
    served.close()
    print("\ndifferential suite, inputs per route:", dict(sorted(served.counts.items())))


@pytest.fixture(scope="module")
def uncut_app(task_models: Path) -> Iterator[App]:
    """The task exports served with --no-auto-truncate."""
    served = App(task_models, auto_truncate=False)
    yield served
    served.close()


class References:
    """Each model alone on one text (or pair), whole, tokenised by transformers with the
    truncation asked."""

    def __init__(self, repository: TaskRepository) -> None:
        from transformers import PreTrainedTokenizerFast

        self.repository = repository
        own = tokenizer()
        own.no_padding()
        own.no_truncation()
        self.fast = PreTrainedTokenizerFast(
            tokenizer_object=own,
            pad_token="[PAD]",
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        )
        configs = {n: tomllib.loads(c) for n, c in repository.configs.items()}
        self.max_length = {n: c["tokenizer"]["max_length"] for n, c in configs.items()}
        embedder = repository.models / "embedder" / "1" / "model.onnx"
        self.embedder = side_session(GraphFile(embedder, ("CPUExecutionProvider",)))

    def encode(
        self, model: str, first: str, second: str | None = None, side: str = "right"
    ) -> dict[str, Any] | None:
        """The tokenizer's encoding cut to the model's length from `side`, as transformers cuts
        it; None when `truncate` is off and the text is longer than the model takes or than the
        characters the server reads uncut (checked by the caller)."""
        self.fast.truncation_side = side
        return dict(self.fast(first, second, truncation=True, max_length=self.max_length[model]))

    def too_long(self, model: str, first: str, second: str | None = None) -> bool:
        """Whether the text (pair) cannot be answered uncut: longer than the model takes in
        tokens, or than the server reads in characters."""
        tokens = len(self.fast(first, second, truncation=False)["input_ids"])
        chars = max(len(first), len(second or ""))
        return tokens > self.max_length[model] or chars > CHARS

    def states(self, text: str, side: str = "right") -> np.ndarray:
        """The embedder's per-token states, the ONNX model alone at batch 1."""
        e = self.encode("embedder", text, side=side)
        assert e is not None
        feeds = {k: np.array([v], np.int64) for k, v in e.items()}
        return np.asarray(self.embedder.run(["last_hidden_state"], feeds)[0][0])

    def embedding(self, text: str, side: str = "right") -> np.ndarray:
        return pooled_reference(self.states(text, side), "mean", normalize=True)

    def logits(self, model: Any, first: str, second: str | None, side: str, name: str) -> Any:
        e = self.encode(name, first, second, side)
        assert e is not None
        with torch.no_grad():
            return model(**{k: torch.tensor([v]) for k, v in e.items()}).logits[0].numpy()

    @functools.cached_property
    def classify(self) -> Any:
        from transformers import pipeline

        model = self.repository.sentiment.model
        return pipeline("text-classification", model=model, tokenizer=self.fast)

    @functools.cached_property
    def tag(self) -> Any:
        """The token-classification pipeline, which cuts a text at its tokenizer's
        `model_max_length` from the end."""
        from transformers import PreTrainedTokenizerFast, pipeline

        own = tokenizer()
        own.no_padding()
        own.no_truncation()
        fast = PreTrainedTokenizerFast(
            tokenizer_object=own,
            pad_token="[PAD]",
            model_max_length=self.max_length["tagger"],
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        )
        model = self.repository.tagger.model
        return pipeline("token-classification", model=model, tokenizer=fast)


@pytest.fixture(scope="module")
def refs(task_repository: TaskRepository) -> References:
    return References(task_repository)


def sweep(tier: str) -> Callable[[Any], Any]:
    """Hypothesis settings for a tier: a fixed seed, the tier's number of inputs."""
    return settings(
        max_examples=EXAMPLES[tier],
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def close(got: Any, want: Any) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=TOLERANCE, rtol=TOLERANCE)


def refused(answer: httpx.Response) -> bool:
    """A 422 (too long, with `truncate` off); anything else must be a 200."""
    assert answer.status_code in (200, 422), answer.text
    return answer.status_code == 422


# -- embeddings: OpenAI's, Cohere's, /predict's text, KServe v2's text, /embed_all ----------


@pytest.mark.parametrize("tier", TIERS)
def test_openai_embeddings(app: App, refs: References, tier: str) -> None:
    @sweep(tier)
    @given(batch=texts, side=sides, truncate=st.booleans(), prompt=st.sampled_from([None, "query"]))
    def check(batch: list[str], side: str, truncate: bool, prompt: str | None) -> None:
        body = {"model": "embedder", "input": batch, "truncate": truncate}
        body |= {"truncation_direction": side} | ({"prompt_name": prompt} if prompt else {})
        answer = app.post("/v1/embeddings", body, len(batch))
        sent = [("query: " if prompt else "") + t for t in batch]
        if not truncate and any(refs.too_long("embedder", t) for t in sent):
            assert refused(answer)
            return
        assert answer.status_code == 200, answer.text
        for item, t in zip(answer.json()["data"], sent, strict=True):
            close(item["embedding"], refs.embedding(t, side))

    check()


@pytest.mark.parametrize("tier", TIERS)
def test_tei_embed_the_root_and_similarity(app: App, refs: References, tier: str) -> None:
    """TEI's /embed and its root (`normalize`; `truncate` left out: the server's
    --auto-truncate, on) and /similarity, each vector or cosine against the model alone."""

    @sweep(tier)
    @given(
        batch=texts,
        side=sides,
        truncate=st.sampled_from([None, True, False]),
        normalize=st.booleans(),
        path=st.sampled_from(["/embed", "/", "/similarity"]),
    )
    def check(
        batch: list[str], side: str, truncate: bool | None, normalize: bool, path: str
    ) -> None:
        cut = {"truncation_direction": side} | ({} if truncate is None else {"truncate": truncate})
        if path == "/similarity":
            given = {"source_sentence": batch[0], "sentences": batch[1:] or batch}
            body: dict[str, Any] = {"model": "embedder", "inputs": given, "parameters": cut}
        else:
            body = {"model": "embedder", "inputs": batch, "normalize": normalize} | cut
        answer = app.post(path, body, len(batch))
        if truncate is False and any(refs.too_long("embedder", t) for t in batch):
            assert refused(answer)
            return
        assert answer.status_code == 200, answer.text
        if path == "/similarity":
            source, *others = (refs.embedding(t, side) for t in [batch[0], *(batch[1:] or batch)])
            close(answer.json(), [float(np.dot(source, other)) for other in others])
            return
        for got, t in zip(answer.json(), batch, strict=True):
            close(got, pooled_reference(refs.states(t, side), "mean", normalize=normalize))

    check()


@pytest.mark.parametrize("tier", TIERS)
def test_cohere_embed(app: App, refs: References, tier: str) -> None:
    cuts = {"END": "right", "START": "left"}

    @sweep(tier)
    @given(
        batch=texts,
        cut=st.sampled_from(["END", "START", "NONE"]),
        kind=st.sampled_from([None, "search_query", "classification"]),
        version=st.sampled_from(["/v1/embed", "/v2/embed"]),
    )
    def check(batch: list[str], cut: str, kind: str | None, version: str) -> None:
        body = {"model": "embedder", "texts": batch, "truncate": cut, "embedding_types": ["float"]}
        answer = app.post(version, body | ({"input_type": kind} if kind else {}), len(batch))
        sent = [("query: " if kind == "search_query" else "") + t for t in batch]
        if cut == "NONE" and any(refs.too_long("embedder", t) for t in sent):
            assert refused(answer)
            return
        assert answer.status_code == 200, answer.text
        vectors = answer.json()["embeddings"]["float"]
        for vector, t in zip(vectors, sent, strict=True):
            close(vector, refs.embedding(t, cuts.get(cut, "right")))

    check()


@pytest.mark.parametrize("tier", TIERS)
def test_predict_text_and_embed_all(app: App, refs: References, tier: str) -> None:
    """/predict's text and /embed_all: the embedder's per-token states, cut to each text."""

    @sweep(tier)
    @given(batch=texts, side=sides, path=st.sampled_from(["/predict", "/embed_all"]))
    def check(batch: list[str], side: str, path: str) -> None:
        if path == "/predict":
            body: dict[str, Any] = {
                "model": "embedder",
                "text": batch,
                "truncation_direction": side,
                "outputs": ["last_hidden_state"],
            }
        else:
            body = {"model": "embedder", "inputs": batch, "truncate": True}
            body["truncation_direction"] = side
        answer = app.post(path, body, len(batch))
        assert answer.status_code == 200, answer.text
        rows = (
            [o["last_hidden_state"] for o in answer.json()["outputs"]]
            if path == "/predict"
            else answer.json()
        )
        for row, t in zip(rows, batch, strict=True):
            close(row, refs.states(t, side))

    check()


@pytest.mark.parametrize("tier", TIERS)
def test_kserve_v2_text(app: App, refs: References, tier: str) -> None:
    """A BYTES `text` tensor over KServe v2: per-token states padded to the longest, zeros
    past each text's own."""

    @sweep(tier)
    @given(batch=texts, side=sides, truncate=st.booleans())
    def check(batch: list[str], side: str, truncate: bool) -> None:
        body = {
            "inputs": [{"name": "text", "shape": [len(batch)], "datatype": "BYTES", "data": batch}],
            "outputs": [{"name": "last_hidden_state"}],
            "parameters": {"truncate": truncate, "truncation_direction": side},
        }
        answer = app.post("/v2/models/embedder/infer", body, len(batch))
        if not truncate and any(refs.too_long("embedder", t) for t in batch):
            assert answer.status_code == 422, answer.text
            return
        assert answer.status_code == 200, answer.text
        (out,) = answer.json()["outputs"]
        states = np.asarray(out["data"], np.float64).reshape(out["shape"])
        for row, t in zip(states, batch, strict=True):
            want = refs.states(t, side)
            close(row[: len(want)], want)
            assert not row[len(want) :].any()

    check()


# -- TEI's routes with no `truncate`: the server's --auto-truncate, as TEI's default -------

# TEI's --auto-truncate: on by default since TEI 1.9.0 (its docs/source/en/cli_arguments.md:
# "Defaults to `true`"); off, a text past the model's length is refused (TEI: 422 since 1.9,
# 413 before). Every TEI route, its body without `truncate`, on a server started as by
# default (cut, equal to the reference's cut text) and with --no-auto-truncate (refused
# naming `truncate` where the reference says too long, else the same answer).
TEI_ROUTES = ["/embed", "/", "/embed_all", "/embed_sparse", "/similarity", "/rerank",
              "/predict", "/classify", "/classify_tokens"]  # fmt: skip


def tei_body(path: str, batch: list[str], query: str) -> dict[str, Any]:
    """`path`'s body for `batch`, as TEI's clients send it: no `truncate`."""
    if path == "/similarity":
        given = {"source_sentence": batch[0], "sentences": batch[1:] or batch}
        return {"model": "embedder", "inputs": given}
    if path == "/rerank":
        return {"model": "reranker", "query": query, "texts": batch, "raw_scores": True}
    model = {"/embed_sparse": "splade", "/predict": "sentiment", "/classify": "sentiment",
             "/classify_tokens": "tagger"}.get(path, "embedder")  # fmt: skip
    return {"model": model, "inputs": batch if len(batch) != 2 else batch[:1]}


def tei_sequences(path: str, batch: list[str], query: str) -> list[tuple[str, str | None]]:
    """The texts (or pairs) a TEI body of `batch` holds, as `tei_body` makes it."""
    if path == "/similarity":
        return [(t, None) for t in [batch[0], *(batch[1:] or batch)]]
    if path == "/rerank":
        return [(query, t) for t in batch]
    return [(t, None) for t in (batch if len(batch) != 2 else batch[:1])]


def assert_tei_answer(refs: References, path: str, body: dict[str, Any], got: Any) -> None:
    """`got` (a 200's body) against the references, each text cut at the model's length."""
    if path in ("/embed", "/"):
        for vector, t in zip(got, body["inputs"], strict=True):
            close(vector, refs.embedding(t))
    elif path == "/embed_all":
        for states, t in zip(got, body["inputs"], strict=True):
            close(states, refs.states(t))
    elif path == "/embed_sparse":
        special = [vocabulary()[t] for t in SPECIALS]
        for weights, t in zip(got, body["inputs"], strict=True):
            logits = refs.logits(refs.repository.splade, t, None, "right", "splade")
            want = np.log1p(np.maximum(logits, 0)).max(axis=0)
            want[special] = 0
            assert [w["index"] for w in weights] == np.flatnonzero(want > 0).tolist()
            close([w["value"] for w in weights], want[want > 0])
    elif path == "/similarity":
        given = body["inputs"]
        source, *others = (refs.embedding(t) for t in [given["source_sentence"],
                                                          *given["sentences"]])  # fmt: skip
        close(got, [float(np.dot(source, other)) for other in others])
    elif path == "/rerank":
        reranker = refs.repository.reranker.model
        for r in got:
            doc = body["texts"][r["index"]]
            close(r["score"], float(refs.logits(reranker, body["query"], doc, "right",
                                                "reranker")[0]))  # fmt: skip
    elif path in ("/predict", "/classify"):
        texts_ = body["inputs"]
        answers = [got] if isinstance(texts_, str) else got
        for scores, t in zip(answers, [texts_] if isinstance(texts_, str) else texts_,
                             strict=True):  # fmt: skip
            want = refs.classify(t, top_k=None, truncation=True,
                                 max_length=refs.max_length["sentiment"])  # fmt: skip
            expected = {w["label"]: w["score"] for w in want}
            close([s["score"] for s in scores], [expected[s["label"]] for s in scores])
    else:  # /classify_tokens
        for found, t in zip(got, body["inputs"], strict=True):
            want = list(refs.tag(t, aggregation_strategy="none"))
            assert [(e["word"], e["start"], e["end"]) for e in found] == [
                (w["word"], w["start"], w["end"]) for w in want
            ]
            close([e["score"] for e in found], [float(w["score"]) for w in want])


@pytest.mark.parametrize("tier", TIERS)
def test_tei_routes_without_truncate_follow_auto_truncate(
    app: App, uncut_app: App, refs: References, tier: str
) -> None:
    """A text past the model's length with no `truncate`: cut where the server auto-truncates
    (its default, as TEI's), refused naming `truncate` where it does not."""

    @sweep(tier)
    @given(batch=texts, query=text, path=st.sampled_from(TEI_ROUTES), auto=st.booleans())
    def check(batch: list[str], query: str, path: str, auto: bool) -> None:
        refs.fast.truncation_side = "right"
        body = tei_body(path, batch, query)
        sequences = tei_sequences(path, batch, query)
        answer = (app if auto else uncut_app).post(path, body, len(sequences))
        model = body["model"]
        if not auto and any(refs.too_long(model, a, b) for a, b in sequences):
            assert refused(answer)
            assert "truncate" in answer.json()["error"]
            return
        assert answer.status_code == 200, answer.text
        assert_tei_answer(refs, path, body, answer.json())

    check()


# -- pairs: rerank (TEI's, Cohere's) and classify -------------------------------------------


@pytest.mark.parametrize("tier", TIERS)
def test_rerank(app: App, refs: References, tier: str) -> None:
    reranker = refs.repository.reranker.model

    @sweep(tier)
    @given(
        query=text,
        docs=texts,
        side=sides,
        truncate=st.booleans(),
        shape=st.sampled_from(["tei", "cohere", "vllm"]),
    )
    def check(query: str, docs: list[str], side: str, truncate: bool, shape: str) -> None:
        if shape == "tei":
            body = {"query": query, "texts": docs, "truncate": truncate, "raw_scores": True}
            answer = app.post("/rerank", body | {"truncation_direction": side}, len(docs))
        elif shape == "cohere":
            side = "right"  # (Cohere's body has no side: a pair is cut from its end)
            body = {"model": "reranker", "query": query, "documents": docs, "truncate": truncate}
            answer = app.post("/v1/rerank", body, len(docs))
        else:  # vLLM's /score: no side, and cut as the server's --auto-truncate says (on)
            side, truncate = "right", True
            body = {"model": "reranker", "text_1": query, "text_2": docs}
            answer = app.post("/score", body, len(docs))
        if not truncate and any(refs.too_long("reranker", query, d) for d in docs):
            assert refused(answer)
            return
        assert answer.status_code == 200, answer.text
        given = answer.json()
        if shape == "cohere":
            results = given["results"]
        elif shape == "vllm":
            results = [{"index": d["index"], "relevance_score": d["score"]} for d in given["data"]]
        else:
            results = given
        assert sorted(r["index"] for r in results) == list(range(len(docs)))
        for r in results:
            logit = float(refs.logits(reranker, query, docs[r["index"]], side, "reranker")[0])
            want = logit if shape == "tei" else 1 / (1 + np.exp(-logit))
            close(r["score" if shape == "tei" else "relevance_score"], want)

    check()


@pytest.mark.parametrize("tier", TIERS)
def test_classify(app: App, refs: References, tier: str) -> None:
    """/classify's every body form: a text, a pair, a list of texts (one, three or more; two
    strings are a pair), texts each in a list, pairs; each item answered."""

    @sweep(tier)
    @given(
        batch=texts,
        pairs=st.lists(st.tuples(text, text), min_size=1, max_size=4),
        form=st.sampled_from(["text", "pair", "flat", "nested", "pairs"]),
        side=sides,
    )
    def check(batch: list[str], pairs: list[tuple[str, str]], form: str, side: str) -> None:
        if form == "flat" and len(batch) == 2:
            batch = batch[:1]  # (two strings are one pair: that form is "pair")
        items: list[tuple[str, str | None]] = {
            "text": [(batch[0], None)],
            "pair": [pairs[0]],
            "flat": [(t, None) for t in batch],
            "nested": [(t, None) for t in batch],
            "pairs": list(pairs),
        }[form]
        inputs: Any = {
            "text": batch[0],
            "pair": list(pairs[0]),
            "flat": batch,
            "nested": [[t] for t in batch],
            "pairs": [list(p) for p in pairs],
        }[form]
        body = {"model": "sentiment", "inputs": inputs, "truncate": True}
        answer = app.post("/classify", body | {"truncation_direction": side}, len(items))
        assert answer.status_code == 200, answer.text
        got = [answer.json()] if form in ("text", "pair") else answer.json()
        assert len(got) == len(items)
        classify = refs.classify
        for scores, (first, second) in zip(got, items, strict=True):
            refs.fast.truncation_side = side
            given_ = first if second is None else {"text": first, "text_pair": second}
            want = classify(
                given_, top_k=None, truncation=True, max_length=refs.max_length["sentiment"]
            )
            assert {s["label"] for s in scores} == set(SENTIMENT)
            expected = {w["label"]: w["score"] for w in want}
            close([s["score"] for s in scores], [expected[s["label"]] for s in scores])

    check()


# -- per-token heads: sparse weights and entities, and the tokenizer ------------------------


@pytest.mark.parametrize("tier", TIERS)
def test_embed_sparse(app: App, refs: References, tier: str) -> None:
    splade = refs.repository.splade
    special = [vocabulary()[t] for t in SPECIALS]

    @sweep(tier)
    @given(batch=texts, side=sides)
    def check(batch: list[str], side: str) -> None:
        body = {"model": "splade", "inputs": batch, "truncate": True, "truncation_direction": side}
        answer = app.post("/embed_sparse", body, len(batch))
        assert answer.status_code == 200, answer.text
        for weights, t in zip(answer.json(), batch, strict=True):
            logits = refs.logits(splade, t, None, side, "splade")
            want = np.log1p(np.maximum(logits, 0)).max(axis=0)
            want[special] = 0
            assert [w["index"] for w in weights] == np.flatnonzero(want > 0).tolist()
            close([w["value"] for w in weights], want[want > 0])

    check()


@pytest.mark.parametrize("tier", TIERS)
def test_classify_tokens(app: App, refs: References, tier: str) -> None:
    """Entities as transformers' token-classification pipeline gives them for the text alone
    (it cuts at the model's length from the end; so does the request)."""

    @sweep(tier)
    @given(batch=texts, aggregation=st.sampled_from(["none", "simple", "first", "max"]))
    def check(batch: list[str], aggregation: str) -> None:
        body = {"model": "tagger", "inputs": batch, "truncate": True, "aggregation": aggregation}
        answer = app.post("/classify_tokens", body, len(batch))
        assert answer.status_code == 200, answer.text
        for found, t in zip(answer.json(), batch, strict=True):
            want = list(refs.tag(t, aggregation_strategy=aggregation))
            assert len(found) == len(want), t
            for got, expected in zip(found, want, strict=True):
                close(got["score"], float(expected["score"]))
                assert {k: v for k, v in got.items() if k != "score"} == {
                    k: v.item() if isinstance(v, np.generic) else v
                    for k, v in expected.items()
                    if k != "score"
                }

    check()


@pytest.mark.parametrize("tier", TIERS)
def test_tokenize(app: App, refs: References, tier: str) -> None:
    """/tokenize: each token's id and character span, as transformers' offsets give them."""

    @sweep(tier)
    @given(batch=texts, special=st.booleans())
    def check(batch: list[str], special: bool) -> None:
        body = {"model": "sentiment", "inputs": batch, "add_special_tokens": special}
        answer = app.post("/tokenize", body, len(batch))
        assert answer.status_code == 200, answer.text
        refs.fast.truncation_side = "right"
        for tokens, t in zip(answer.json(), batch, strict=True):
            want = refs.fast(
                t,
                add_special_tokens=special,
                truncation=True,
                max_length=refs.max_length["sentiment"],
                return_offsets_mapping=True,
                return_special_tokens_mask=True,
            )
            assert [x["id"] for x in tokens] == want["input_ids"]
            spans = [(x["start"], x["stop"]) for x in tokens if not x["special"]]
            real = zip(want["offset_mapping"], want["special_tokens_mask"], strict=True)
            assert spans == [tuple(o) for o, s in real if not s]

    check()


# -- the real all-MiniLM-L6-v2 against sentence-transformers itself (slow tier) -------------


@pytest.fixture(scope="module")
def minilm_app(minilm_spec: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """minilm served with texts cut at 300 characters before tokenising."""
    models = tmp_path_factory.mktemp("differential-minilm") / "models"
    shutil.copytree(minilm_spec.onnx_path.parent.parent, models / "minilm")
    config = models / "minilm" / "config.toml"
    config.write_text(config.read_text().replace("[tokenizer]\n", "[tokenizer]\nmax_chars = 300\n"))
    served = App(models)
    yield served
    served.close()


@pytest.mark.slow
@pytest.mark.parametrize("side", ["right", "left"])
def test_minilm_embeddings_equal_sentence_transformers(minilm_app: App, side: str) -> None:
    """/v1/embeddings on minilm, each vector equal to what sentence-transformers' encode
    gives for that text alone (its tokenizer cut from the side asked)."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    from modelgen.minilm import _model_source

    st_model = SentenceTransformer(str(_model_source()), device="cpu")
    st_model.tokenizer.truncation_side = side
    words = st.lists(
        st.tuples(st.sampled_from([*PIECES, "retrieval", "embedding", "server"]), separators),
        min_size=1,
        max_size=400,
    ).map(lambda parts: "".join("".join(p) for p in parts).strip() or "a")

    @sweep("slow")
    @given(batch=st.lists(words, min_size=1, max_size=4))
    def check(batch: list[str]) -> None:
        body = {"model": "minilm", "input": batch, "truncation_direction": side}
        answer = minilm_app.post("/v1/embeddings", body, len(batch))
        assert answer.status_code == 200, answer.text
        want = st_model.encode(batch, normalize_embeddings=True)
        for item, vector in zip(answer.json()["data"], want, strict=True):
            np.testing.assert_allclose(item["embedding"], vector, atol=1e-5)

    check()
