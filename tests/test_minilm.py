"""The real all-MiniLM-L6-v2: tokenizer settings and agreement with sentence-transformers' math."""

from __future__ import annotations

import numpy as np

from bucketserve.loading import ModelSpec, build_model
from tests.engines import Reference


def test_tokenizer_neither_pads_nor_truncates_at_128(minilm_spec: ModelSpec) -> None:
    model = build_model(minilm_spec)
    short, long = model.encode(["hello world", "word " * 200])
    assert len(short) == 4  # [CLS] hello world [SEP]: no padding to 128
    assert len(long) == 202  # 200 words + 2 specials: not cut at 128
    assert len(model.encode(["word " * 400])[0]) == 256  # truncated at the configured 256


def test_text_embeddings_match_the_unpadded_model(minilm_spec: ModelSpec) -> None:
    model = build_model(minilm_spec)
    texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The new movie is awesome and everybody who saw it loved it a lot.",
        "ok",
    ]
    sequences = model.encode(texts)
    answers = model.predict(sequences)
    reference = Reference(minilm_spec)
    for seq, answer in zip(sequences, answers, strict=True):
        embedding = answer["sentence_embedding"]
        assert embedding.shape == (384,)
        np.testing.assert_allclose(np.linalg.norm(embedding), 1.0, atol=1e-5)
        np.testing.assert_allclose(embedding, reference(seq)["sentence_embedding"], atol=1e-5)
    # the two sentences about eating are closer to each other than to the movie one
    e = np.stack([a["sentence_embedding"] for a in answers])
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2
