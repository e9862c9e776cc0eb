"""The tasks a model may serve, each named once here: what a route asks the core for, what a
model's rules are kept by (`ModelInfo.rules`), what `loading` builds a rule for from the
config's section, and what the registry resolves a call's model by. Imports nothing.
"""

from __future__ import annotations

from enum import StrEnum


class Task(StrEnum):
    """In the order models list them (`GET /v1/models`, the config route's `tasks`)."""

    PREDICT = "predict"  # the model's own outputs: every model serves it
    EMBED = "embed"  # a vector per text: [embedding]
    EMBED_ALL = "embed_all"  # a vector per token: [multi_vector], or a per-token [embedding]
    EMBED_SPARSE = "embed_sparse"  # a weight per vocabulary entry: [sparse]
    CLASSIFY = "classify"  # a score per label of a text or a pair: [classifier]
    CLASSIFY_TOKENS = "classify_tokens"  # a score per label of each token: [token_classifier]
    RERANK = "rerank"  # a (query, document) pair's relevance: [classifier]'s rerank_label
    TOKENIZE = "tokenize"  # the model's tokenizer, run alone: [tokenizer]
    FILL_MASK = "fill_mask"  # a masked LM's guesses for each mask: [sparse] splade
