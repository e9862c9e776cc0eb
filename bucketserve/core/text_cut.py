"""Cutting a long text by characters before it is tokenised, without changing what the
tokenizer keeps of it. Used by the model (`Model.encode`) on every text route.

A text's cost to tokenise grows with its characters, so a text past the model's `max_chars`
is first cut to a window of characters on the side the request keeps (its start for a right
cut, its end for a left one). That window must hold every token the tokenizer would keep of
the whole text, or the answer is the model's answer for some other text. A token is known to
be the whole text's own when a word boundary of the tokenizer's lies between it and the cut:
every token of the window but those of the word the cut may split (`Encoding.word_ids`; a
tokenizer that does not split words has one word, so nothing is known). Where the window does
not show the tokens kept (long words, one of them an `[UNK]` each), it grows fourfold, up to
the whole text; past `GROWTH` times `max_chars` the text is refused rather than answered from
a guess. A pair keeps the tokens that the tokenizer's longest-first rule (`kept_of_pair`)
gives for its parts' lengths: it is cut where every length the parts may have in full keeps
the same tokens, and those are known.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bucketserve.errors import InvalidInput

GROWTH = 16  # the widest window, in max_chars: what one text may cost the tokenizer
BEYOND = 1 << 40  # a length past any text's, for a part whose full length is unknown

WordIds = Callable[[str], Sequence[int | None]]  # a text's tokens' words, no special tokens


@dataclass(frozen=True)
class Cut:
    """A text (or pair) as it is tokenised, and how many characters were cut from the start
    of a single text (a left cut): its tokens' offsets lie that far into the text as sent."""

    text: str | tuple[str, str]
    shift: int = 0


@dataclass(frozen=True)
class _Part:
    """What a window of one text shows: its tokens, and how many of them are the whole
    text's own (`known`); `whole` when the window is the whole text."""

    window: str
    tokens: int
    known: int
    whole: bool


def cut_text(
    text: str | tuple[str, str],
    index: int,
    *,
    chars: int,
    left: bool,
    allowed: bool,
    budget: int,
    words: WordIds,
) -> Cut:
    """`text` (or a pair) cut to what the tokenizer needs of it. `budget`: the tokens it keeps
    of a text (or of a pair's two together), special tokens apart; `allowed`: whether the
    request lets a text be cut (if not, one past `chars` is refused)."""
    parts = (text,) if isinstance(text, str) else text
    if all(len(part) <= chars for part in parts):
        return Cut(text)
    if not allowed:
        where = "text" if isinstance(text, str) else "pair"
        longest = max(len(part) for part in parts)
        raise InvalidInput(
            f"{where} {index}: {longest} characters, more than the {chars} this model reads "
            "of a text uncut: send it shorter, or truncate=true to have it cut"
        )
    window = chars
    while True:
        seen = [_seen(part, window, left, words) for part in parts]
        if _decided(seen, budget):
            if isinstance(text, str):
                return Cut(seen[0].window, len(text) - len(seen[0].window) if left else 0)
            return Cut((seen[0].window, seen[1].window))
        window *= 4
        if window > GROWTH * chars:
            raise InvalidInput(
                f"text {index}: the tokens the model keeps of it are not within its "
                f"{GROWTH * chars} characters {'last' if left else 'first'} (words too long "
                "to tell where they end): send it shorter"
            )


def _seen(part: str, window: int, left: bool, words: WordIds) -> _Part:
    if len(part) <= window:
        count = len(words(part))
        return _Part(part, count, count, True)
    piece = part[-window:] if left else part[:window]
    ids = list(words(piece))
    at_cut = ids[:1] if left else ids[-1:]  # the word the cut may split: none of it known
    split = sum(1 for _ in itertools.takewhile(at_cut.__contains__, ids if left else ids[::-1]))
    return _Part(piece, len(ids), len(ids) - split, False)


def _decided(seen: list[_Part], budget: int) -> bool:
    """Whether the tokens kept are the same for every full length the parts may have, and
    all of them known."""
    if len(seen) == 1:
        (part,) = seen
        return part.whole or part.known >= budget
    first, second = seen
    outcomes = {
        kept_of_pair(a, b, budget)
        for a in _lengths(first, second, budget)
        for b in _lengths(second, first, budget)
    }
    if len(outcomes) != 1:
        return False
    (kept,) = outcomes
    return all(part.whole or k <= part.known for part, k in zip(seen, kept, strict=True))


def _lengths(part: _Part, other: _Part, budget: int) -> set[int]:
    """The lengths `part` may have in full that `kept_of_pair` can tell apart: its own when
    whole; else every value from its known tokens on at which a comparison of the rule may
    change (the budget, its half, the other part's lengths), and one past them all."""
    if part.whole:
        return {part.tokens}
    marks = {budget, budget // 2, other.tokens, other.known}
    near = {m + d for m in marks for d in (-1, 0, 1)}
    return {n for n in near if n >= part.known} | {part.known, BEYOND}


def kept_of_pair(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many tokens of each part a pair keeps (the tokenizers' longest-first rule): both
    whole when they fit; else the shorter whole and the longer cut to the rest when the
    shorter takes at most half; else half each, the odd one to the longer (the second on a
    tie)."""
    if first + second <= budget:
        return first, second
    swapped = first > second
    short = second if swapped else first
    to_short, to_long = short, short if short > budget else max(short, budget - short)
    if to_short + to_long > budget:
        to_short, to_long = budget // 2, budget // 2 + budget % 2
    to_first, to_second = (to_long, to_short) if swapped else (to_short, to_long)
    return min(to_first, first), min(to_second, second)
