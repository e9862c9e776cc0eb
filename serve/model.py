"""A loaded model: validation at the edge, bucket plan, executor, collate -> run -> split.

`Model.predict(sequences)` is the Python API; the server's batcher calls `run_batch` with
batches it formed itself across requests.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from serve.bucketing import BucketKey, BucketPlan, Layout, split
from serve.config import InputRole
from serve.errors import InvalidInput
from serve.padcheck import is_pad_sensitive
from serve.repository import ModelSpec
from serve.runtime import Executor, make_executor

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """The tokenizer, with any padding it carries turned off and truncation at `max_length`.

    (all-MiniLM's tokenizer.json pads every text to 128: that would make every request cost
    128 tokens whatever its length.)
    """
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length)
    return tokenizer


class Model:
    def __init__(self, spec: ModelSpec, strategy: str | None = None) -> None:
        """Load `spec`: pad-safety check, then the executor, then bind and warm the keys that
        the config asks for. `strategy` overrides the config's mode/binding (tests, benchmarks)."""
        self.spec = spec
        self.name = spec.name
        config = spec.config
        self.layout = Layout.from_spec(spec)
        self.pad_sensitive = (
            config.pad_sensitive
            if config.pad_sensitive is not None
            else is_pad_sensitive(spec, self.layout)
        )
        batching = config.batching
        self.plan = BucketPlan(
            tuple(batching.edges),
            batching.max_batch_size,
            batching.max_batch_tokens,
            exact_lengths=self.pad_sensitive,
        )
        strategy = strategy or (config.binding if config.mode == "bucketing" else "mutable")
        if self.pad_sensitive:
            strategy = "mutable"  # batches of one exact length run at that length: no padding
        self.executor: Executor = make_executor(strategy, spec, self.plan)
        self.tokenizer = (
            load_tokenizer(spec.tokenizer_path, config.tokenizer.max_length)
            if spec.tokenizer_path is not None and config.tokenizer is not None
            else None
        )
        seq_cfg = config.inputs[config.sequence_input]
        self._tokens = seq_cfg.role is InputRole.TOKENS
        self._vocab_size = seq_cfg.vocab_size
        seq_dims = spec.signature.inputs[config.sequence_input].dims
        self._feature_dim = seq_dims[2] if len(seq_dims) == 3 else None
        self._dtype = spec.signature.inputs[config.sequence_input].dtype
        keys = self.plan.all_keys() if batching.prepare == "all" and not self.pad_sensitive else []
        for key in [self.plan.default_key, *keys]:
            self.prepare(key)
        log.info(
            "model %s v%d: %s, keys %s bound, providers %s%s",
            self.name,
            spec.version,
            self.executor.strategy,
            ", ".join(map(str, sorted(self.executor.bound_keys))),
            self.executor.providers,
            ", pad-sensitive" if self.pad_sensitive else "",
        )

    @property
    def strategy(self) -> str:
        return self.executor.strategy

    def prepare(self, key: BucketKey) -> None:
        """Bind `key` ahead of its first batch (MXNet's `prepare`) and warm it with pad rows."""
        if self.executor.prepare(key):
            self.executor.run(key, self.layout.collate([], *self.executor.batch_shape(key, [1])))

    def validate(self, item: Any, index: int = 0) -> np.ndarray:
        """One request item -> a sequence array, or InvalidInput saying what is wrong with it."""
        where = f"sequence {index}"
        try:
            array = np.asarray(item)
        except (ValueError, TypeError):
            raise InvalidInput(f"{where}: not a rectangular array") from None
        if self._tokens:
            if array.ndim != 1 or array.dtype.kind not in "iu":
                raise InvalidInput(f"{where}: expected a list of integer token ids")
            assert self._vocab_size is not None
            if array.size and (array.min() < 0 or array.max() >= self._vocab_size):
                raise InvalidInput(f"{where}: token ids must lie in [0, {self._vocab_size})")
        else:
            if array.ndim != 2 or array.dtype.kind not in "iuf":
                raise InvalidInput(
                    f"{where}: expected a list of {self._feature_dim}-number vectors"
                )
            if array.shape[1] != self._feature_dim:
                raise InvalidInput(
                    f"{where}: each step needs {self._feature_dim} features, got {array.shape[1]}"
                )
            if not np.isfinite(array).all():
                raise InvalidInput(f"{where}: features must be finite (no NaN or infinity)")
        if len(array) == 0:
            raise InvalidInput(f"{where}: empty")
        if len(array) > self.plan.max_length:
            raise InvalidInput(
                f"{where}: length {len(array)} exceeds the longest bucket ({self.plan.max_length})"
            )
        return array.astype(self._dtype, copy=False)

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Texts -> token id sequences, for models whose config names a tokenizer."""
        if self.tokenizer is None:
            raise InvalidInput(f"model {self.name} has no tokenizer: send 'sequences'")
        encodings = self.tokenizer.encode_batch(list(texts))
        return [np.asarray(e.ids, dtype=self._dtype) for e in encodings]

    def batch_shape(self, key: BucketKey, lengths: Sequence[int]) -> tuple[int, int]:
        """(rows, length) a batch with these lengths is computed at: its cost in tokens."""
        return self.executor.batch_shape(key, lengths)

    def run_batch(self, key: BucketKey, sequences: Sequence[np.ndarray]) -> list[Outputs]:
        """Collate -> run -> split for one batch of validated sequences that fit `key`."""
        lengths = [len(s) for s in sequences]
        rows, length = self.executor.batch_shape(key, lengths)
        outputs = self.executor.run(key, self.layout.collate(sequences, rows, length))
        return split(outputs, lengths, self.layout.per_step)

    def predict(self, items: Sequence[Any]) -> list[Outputs]:
        """Outputs for each item, in order: the Python API, batched by bucket."""
        sequences = [self.validate(item, i) for i, item in enumerate(items)]
        results: dict[int, Outputs] = {}
        for key, indices in self.plan.batches([len(s) for s in sequences]):
            batch = self.run_batch(key, [sequences[i] for i in indices])
            results.update(zip(indices, batch, strict=True))
        return [results[i] for i in range(len(sequences))]
