"""A small WordPiece tokenizer of a fixed English vocabulary (69 words, letters as pieces),
saved as Hugging Face saves BERT's: the tests' and the benchmarks' tiny models read texts
through it, and a text of n known words is n tokens (and the frame's two)."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

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


def tokenizer() -> Tokenizer:
    """A BERT-style tokenizer, saved as Hugging Face saves all-MiniLM's: padding every text to
    128 and truncating there (what import must turn off, and set to the model's length)."""
    vocab = vocabulary()
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
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
