"""A model's text handling, between a request's texts and the token id sequences the model
runs: its tokenizer (and the two it makes of it: one cutting texts from their start, one
cutting nothing), a text's cut to the model's length (`text_cut`), windows over a long text
(and a pair's document), texts joined for late chunking, each token's string and span, and
ids decoded back into text. The model holds one where its config names a tokenizer
(`Model.text`); no ONNX Runtime here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bucketserve.core.layout import segmented
from bucketserve.core.text_cut import BEYOND, cut_text
from bucketserve.errors import InvalidInput

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class Truncation:
    """What to do with a text longer than the model takes: cut it (`allowed`), from its end
    or, `left`, from its start; or refuse it."""

    allowed: bool = True
    left: bool = False


TRUNCATE = Truncation()


class TextCodec:
    def __init__(self, name: str, tokenizer: Tokenizer, dtype: np.dtype, chars: int | None) -> None:
        """`name`: the model's, for what a refusal says; `dtype`: its ids'; `chars`: a text is
        cut to this many characters before tokenising (None: not cut)."""
        self.name = name
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.chars = chars
        self._left: Tokenizer | None = None  # the tokenizer cutting texts from the start
        self._uncut: Tokenizer | None = None  # the tokenizer that cuts nothing: a text's words

    def encode(
        self, texts: Sequence[str | tuple[str, str]], truncation: Truncation = TRUNCATE
    ) -> list[np.ndarray]:
        """Texts, or text pairs (with each token's segment), -> token id sequences, for models
        whose config names a tokenizer; each cut to the model's length as `truncation` says."""
        encodings = [e for e, _ in self._encodings(texts, truncation)]
        dtype = self.dtype
        if texts and isinstance(texts[0], str):
            return [np.asarray(e.ids, dtype=dtype) for e in encodings]
        return [segmented(np.asarray(e.ids, dtype=dtype), e.type_ids) for e in encodings]

    def _encodings(
        self,
        texts: Sequence[str | tuple[str, str]],
        truncation: Truncation = TRUNCATE,
        special: bool = True,
    ) -> list[tuple[Any, int]]:
        """The tokenizer's encodings of texts (or pairs), each with how many characters were
        cut from its start: a text past the model's characters is first cut to a window on
        the side the request keeps, holding every token the tokenizer keeps of it
        (`text_cut`). InvalidInput for one longer than the model takes, unless it may be
        cut."""
        tokenizer = self._tokenizer(truncation)
        chars = self.chars or BEYOND
        pairs = bool(texts) and not isinstance(texts[0], str)
        specials = tokenizer.num_special_tokens_to_add(pairs) if special else 0
        cuts = [
            cut_text(
                text,
                i,
                chars=chars,
                left=truncation.left,
                allowed=truncation.allowed,
                budget=self._max_tokens - specials,
                words=self._words,
            )
            for i, text in enumerate(texts)
        ]
        encodings = tokenizer.encode_batch([c.text for c in cuts], add_special_tokens=special)
        if not truncation.allowed:
            longer = next((i for i, e in enumerate(encodings) if e.overflowing), None)
            if longer is not None:
                raise InvalidInput(
                    f"text {longer}: longer than the model takes ({self._max_tokens} tokens); "
                    "send truncate=true to have it cut"
                )
        return [(e, c.shift) for e, c in zip(encodings, cuts, strict=True)]

    def _tokenizer(self, truncation: Truncation) -> Tokenizer:
        if not truncation.left:
            return self.tokenizer
        if self._left is None:  # (made once, on the first request that asks: a copy)
            left = type(self.tokenizer).from_str(self.tokenizer.to_str())
            left.enable_truncation(self._max_tokens, direction="left")
            self._left = left
        return self._left

    def _words(self, text: str) -> list[int | None]:
        """Each token's word, as the tokenizer splits `text` whole (no special tokens)."""
        return list(self._whole().encode(text, add_special_tokens=False).word_ids)

    def _whole(self) -> Tokenizer:
        """The tokenizer that cuts nothing."""
        if self._uncut is None:  # (made once, on the first long text: a copy)
            uncut = type(self.tokenizer).from_str(self.tokenizer.to_str())
            uncut.no_truncation()
            self._uncut = uncut
        return self._uncut

    def encode_windows(self, texts: Sequence[str], overlap: int) -> list[list[np.ndarray]]:
        """Each text whole, as windows of the model's length: its tokens cut into runs that
        fill a window with the tokenizer's special tokens around them, each run starting
        `overlap` tokens before the last one ended (a text that fits is one window, as
        `encode` gives it). Nothing of a text is cut, its characters included."""
        tokenizer = self._tokenizer(TRUNCATE)
        room = self._max_tokens - tokenizer.num_special_tokens_to_add(False)
        dtype = self.dtype
        windows = []
        for encoding in self._whole().encode_batch(list(texts), add_special_tokens=False):
            encoding.truncate(room, stride=overlap)
            runs = [encoding, *encoding.overflowing]
            windows.append([np.asarray(tokenizer.post_process(r).ids, dtype) for r in runs])
        return windows

    def encode_chunks(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int | None]]:
        """Texts as one sequence, one after another inside the tokenizer's special tokens
        (Jina's late chunking), and each token's text (None: a special token);
        InvalidInput when together they are longer than the model takes."""
        self._tokenizer(TRUNCATE)  # (a model without a tokenizer refuses texts)
        whole = self._whole()
        parts = whole.encode_batch(list(texts), add_special_tokens=False)
        merged = type(parts[0]).merge(parts, growing_offsets=True)  # (Encoding.merge)
        framed = whole.post_process(merged)
        if len(framed.ids) > self._max_tokens:
            raise InvalidInput(
                f"late_chunking: the inputs together take {len(framed.ids)} tokens, more than "
                f"the model's {self._max_tokens}; send fewer, or embed them apart",
                param="input",
            )
        owner = iter([i for i, part in enumerate(parts) for _ in part.ids])
        chunks = [None if special else next(owner) for special in framed.special_tokens_mask]
        return np.asarray(framed.ids, self.dtype), chunks

    def encode_pair_windows(
        self, pairs: Sequence[tuple[str, str]], overlap: int
    ) -> list[list[tuple[np.ndarray, tuple[int, int]]]]:
        """Each (query, document) pair with the document whole: the query kept whole in every
        window and the document's tokens cut into runs that fill the rest, as
        `encode_windows` cuts a text; each window with its segments, and the characters of
        the document it holds."""
        tokenizer = self._tokenizer(TRUNCATE)
        whole = self._whole()
        frame = tokenizer.num_special_tokens_to_add(True)
        dtype = self.dtype
        windows = []
        for i, (query, document) in enumerate(pairs):
            asked = whole.encode(query, add_special_tokens=False)
            room = self._max_tokens - frame - len(asked.ids)
            if room <= overlap:
                raise InvalidInput(
                    f"pair {i}: the query takes {len(asked.ids)} of the model's "
                    f"{self._max_tokens} tokens, and leaves windows of the document none "
                    f"past their overlap ({overlap}); send a shorter query, or long_inputs "
                    "truncate"
                )
            encoding = whole.encode(document, add_special_tokens=False)
            encoding.truncate(room, stride=overlap)
            runs = [encoding, *encoding.overflowing]
            pair_windows = []
            for run in runs:
                framed = tokenizer.post_process(asked, run)
                ids = segmented(np.asarray(framed.ids, dtype), framed.type_ids)
                span = (run.offsets[0][0], run.offsets[-1][1]) if run.offsets else (0, 0)
                pair_windows.append((ids, span))
            windows.append(pair_windows)
        return windows

    def tokens(
        self, texts: Sequence[str], special: bool = True, truncation: Truncation = TRUNCATE
    ) -> list[list[dict[str, Any]]]:
        """Each text's tokens as the model's tokenizer makes them (cut to its length): id, the
        text it covers (a special token's own), whether it is special, its character span,
        and the token's own string (`piece`: a WordPiece continuation's "##s")."""
        return self._tokens(texts, self._encodings(texts, truncation, special))

    def encode_with_tokens(
        self, texts: Sequence[str], truncation: Truncation = TRUNCATE
    ) -> tuple[list[np.ndarray], list[list[dict[str, Any]]]]:
        """`encode` and `tokens` of the same texts from one tokenisation: each text's ids,
        and its tokens (for a head that reads a text's own tokens: spans, strings)."""
        encodings = self._encodings(texts, truncation)
        dtype = self.dtype
        return [np.asarray(e.ids, dtype=dtype) for e, _ in encodings], self._tokens(
            texts, encodings
        )

    @staticmethod
    def _tokens(
        texts: Sequence[str], encodings: Sequence[tuple[Any, int]]
    ) -> list[list[dict[str, Any]]]:
        return [
            [
                {"id": i, "text": piece if mark else text[a + shift : b + shift]}
                | {"special": bool(mark)}
                | ({} if mark else {"start": a + shift, "stop": b + shift})
                | {"piece": piece}
                for i, piece, mark, (a, b) in zip(
                    e.ids, e.tokens, e.special_tokens_mask, e.offsets, strict=True
                )
            ]
            for text, (e, shift) in zip(texts, encodings, strict=True)
        ]

    def joined(self, pieces: Sequence[str]) -> str:
        """Token strings joined into text, by the tokenizer's decoder (WordPiece's "##")."""
        tokenizer = self._tokenizer(TRUNCATE)
        decoder = tokenizer.decoder
        return str(decoder.decode(list(pieces))) if decoder is not None else "".join(pieces)

    def decode(self, rows: Sequence[Sequence[int]], skip_special: bool = True) -> list[str]:
        """Token id lists -> texts, by the model's tokenizer (ids it does not know refused)."""
        tokenizer = self._tokenizer(TRUNCATE)
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        for r, row in enumerate(rows):
            wrong = next((i for i in row if not 0 <= i < size), None)
            if wrong is not None:
                raise InvalidInput(f"ids {r}: {wrong} is not a token id (0 to {size - 1})")
        return list(tokenizer.decode_batch([list(r) for r in rows], skip_special))

    @property
    def _max_tokens(self) -> int:
        assert self.tokenizer.truncation is not None  # (`load_tokenizer` turns it on)
        return int(self.tokenizer.truncation["max_length"])
