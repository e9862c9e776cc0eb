"""A small WordPiece tokenizer of a fixed English vocabulary (69 words, letters as pieces),
saved as Hugging Face saves BERT's: the tests' and the benchmarks' tiny models read texts
through it, and a text of n known words is n tokens (and the frame's two). Beside it, a
tokenizer of whole words with another family's special tokens and frame (`word_level`:
Gemma's `<bos> ... <eos>`), for the tiny copies of those releases."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordLevel, WordPiece

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = """
the a an of to in on for with is was are be by at as it this that from or and not but model
server batch bucket length sequence token text word embed query answer fast slow exact padding
runtime graph onnx serve request reply cat dog house river tree book read write run walk blue
green red small large long short new old good bad day night
""".split()  # noqa: SIM905 (a paragraph reads better than 69 quoted words)
LETTERS = list("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-")


def vocabulary() -> dict[str, int]:
    pieces = SPECIALS + WORDS + LETTERS + [f"##{c}" for c in LETTERS]
    return {piece: i for i, piece in enumerate(dict.fromkeys(pieces))}


def tokenizer(lowercase: bool = True) -> Tokenizer:
    """A BERT-style tokenizer, saved as Hugging Face saves all-MiniLM's: padding every text to
    128 and truncating there (what import must turn off, and set to the model's length).
    `lowercase=False`: case kept, as a cased release's (LaBSE's)."""
    vocab = vocabulary()
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(SPECIALS)  # (as BERT's tokenizer.json lists them: special)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=128)
    tok.enable_truncation(128)
    return tok


def word_level(specials: list[str], words: list[str], first: str, last: str) -> Tokenizer:
    """`specials` at ids 0, 1, ..., then `words`, each word (split at spaces and punctuation)
    one token, unknown ones `specials`' `<unk>`; a text framed `first $A last`, as a release
    whose tokenizer adds its `<bos>` and `<eos>` frames it. No padding, no truncation."""
    vocab = {word: i for i, word in enumerate(dict.fromkeys([*specials, *words]))}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}",
        pair=f"{first} $A {last} $B {last}",
        special_tokens=[(first, vocab[first]), (last, vocab[last])],
    )
    tok.add_special_tokens(specials)
    return tok
