"""Texts cut by characters before tokenising keep exactly what the tokenizer keeps of the whole
text: property-based, against the tokenizer itself on each whole text (or pair), over four
families of tokenizers (WordPiece as BERT's, byte-level BPE as RoBERTa's, a Unigram under
Metaspace as SentencePiece's, and one that splits no words), with a character limit small
enough that almost every text crosses it, both truncation sides, pairs whose parts each
overflow, long words, and unicode edge cases."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

from bucketserve.core.model import Model, Truncation
from bucketserve.core.task import Task
from bucketserve.core.text_cut import kept_of_pair
from bucketserve.errors import InvalidInput
from tests.exports import WORDS
from tests.exports import tokenizer as wordpiece
from tests.fakes import fake_model

MAX_LENGTH = 16  # tokens, special ones included
CHARS = 40  # the characters a text is first cut to: most texts below are longer

# words as users write them, and the edge cases of unicode and tokenisation
PIECES = [
    *WORDS[:30],
    "supercalifragilistic" * 3,  # one long word: WordPiece's [UNK]
    "x" * 130,  # past WordPiece's longest word
    "naïve",
    "cafe\u0301",  # a combining accent after its letter
    "日本語の文章",  # CJK: BERT splits every character
    "😀👍🏽",  # emoji, a skin tone modifier
    "\u200b",  # a zero-width space
    "don't",
    "U.S.A.",
    "3.14159",
    "\t",
    "\n",
    "  ",
    "ﬁne",  # a ligature NFKC undoes
]
CORPUS = [" ".join(WORDS[i : i + 7]) for i in range(0, len(WORDS), 3)] + PIECES


@functools.cache
def byte_level() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "<pad>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>"))
    )
    return tok


@functools.cache
def sentencepiece(split: bool = True) -> Tokenizer:
    """A Unigram under Metaspace (`split` False: one word, as some Llama-era files are)."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(split=split)
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B:1 </s>:1", special_tokens=[("</s>", 1)]
    )
    return tok


TOKENIZERS = {
    "wordpiece": wordpiece,
    "byte-level": byte_level,
    "sentencepiece": sentencepiece,
    "one-word": functools.partial(sentencepiece, False),
}


def model_with(tok: Tokenizer) -> Model:
    """A model whose tokenizer is `tok` as the loader sets it up, texts cut at CHARS."""
    tok = Tokenizer.from_str(tok.to_str())
    tok.no_padding()
    tok.enable_truncation(MAX_LENGTH)
    model, _ = fake_model()
    info = dataclasses.replace(model.info, text_chars=CHARS, task_rules={Task.TOKENIZE: True})
    return Model(info, model.executor, tok)


def whole(tok: Tokenizer, text: Any, left: bool) -> Any:
    """The tokenizer's own encoding of the whole text (or pair), cut to MAX_LENGTH."""
    reference = Tokenizer.from_str(tok.to_str())
    reference.no_padding()
    reference.enable_truncation(MAX_LENGTH, direction="left" if left else "right")
    return reference.encode(*text) if isinstance(text, tuple) else reference.encode(text)


separators = st.sampled_from([" ", " ", " ", "  ", "\n", "\t", ", ", ". ", "", "-"])
texts = st.lists(
    st.tuples(st.sampled_from(PIECES), separators).map("".join), min_size=1, max_size=40
).map(lambda parts: "".join(parts).strip() or "a")


@pytest.mark.parametrize("family", TOKENIZERS)
@settings(max_examples=60, deadline=None, derandomize=True)
@given(text=texts, left=st.booleans())
def test_a_cut_text_keeps_the_tokens_of_the_whole(family: str, text: str, left: bool) -> None:
    tok = TOKENIZERS[family]()
    model = model_with(tok)
    if family == "one-word" and len(text) > 16 * CHARS:  # (no window shows a token as known)
        with pytest.raises(InvalidInput, match="send it shorter"):
            model.encode([text], Truncation(left=left))
        return
    (ids,) = model.encode([text], Truncation(left=left))
    assert ids.tolist() == whole(tok, text, left).ids
    (tokens,) = model.text.tokens([text], truncation=Truncation(left=left))
    reference = whole(tok, text, left)
    assert [(t.get("start"), t.get("stop")) for t in tokens] == [
        (None, None) if special else span
        for span, special in zip(reference.offsets, reference.special_tokens_mask, strict=True)
    ]


@pytest.mark.parametrize("family", ["wordpiece", "byte-level", "sentencepiece"])
@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(first=texts, second=texts, left=st.booleans())
def test_a_cut_pair_keeps_the_tokens_of_the_whole(
    family: str, first: str, second: str, left: bool
) -> None:
    tok = TOKENIZERS[family]()
    (pair,) = model_with(tok).encode([(first, second)], Truncation(left=left))
    reference = whole(tok, (first, second), left)
    assert pair["id"].tolist() == reference.ids
    assert pair["segment"].tolist() == reference.type_ids


def test_a_left_cut_keeps_the_end_of_a_text_past_the_characters() -> None:
    """The issue's case: a long text of alphas ending in omegas, cut from its start."""
    model = model_with(wordpiece())
    text = " ".join(["model"] * 200 + ["server"] * 30)
    (ids,) = model.encode([text], Truncation(left=True))
    vocab = wordpiece().get_vocab()
    assert set(ids[1:-1].tolist()) == {vocab["server"]}


def test_truncate_false_refuses_a_text_past_the_characters_that_fits_in_tokens() -> None:
    model = model_with(wordpiece())
    text = "x" * 130 + " model"  # two tokens: an [UNK] and a word, past 40 characters
    with pytest.raises(InvalidInput, match="more than the 40 this model reads"):
        model.encode([text], Truncation(allowed=False))
    assert model.encode([text])[0].tolist() == whole(wordpiece(), text, False).ids


def test_a_text_whose_kept_tokens_lie_past_every_window_is_refused() -> None:
    """A tokenizer that splits no words shows no token as known: a text past the widest
    window is refused, never answered from a guess."""
    model = model_with(sentencepiece(False))
    with pytest.raises(InvalidInput, match="send it shorter"):
        model.encode(["ab " * 300])


@pytest.mark.parametrize("budget", [5, 6, 13])
def test_the_pair_rule_is_the_tokenizers_own(budget: int) -> None:
    tok = Tokenizer.from_str(wordpiece().to_str())
    tok.no_padding()
    tok.enable_truncation(budget + 3)
    for a, b in np.ndindex(budget + 4, budget + 4):
        encoding = tok.encode(" ".join(["model"] * (a + 1)), " ".join(["query"] * (b + 1)))
        kept = (encoding.type_ids.count(0) - 2, encoding.type_ids.count(1) - 1)
        assert kept_of_pair(a + 1, b + 1, budget) == kept
