"""An embedding model's calibration, fitted at load: each dimension's range over the vectors
of calibration texts, which int8 and uint8 answers scale to 256 steps (`core.quantize`). The
texts are the lines of the file the config's `[embedding] calibration` names (in the version's
folder), else texts drawn from the model's own tokenizer as the load-time check draws them
(`traffic`), of lengths spread from 8 to 128 tokens (or the model's length, if shorter).
The ranges are kept in the server's cache under the model's fingerprint, so a restart with
the same content reads them back.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from bucketserve.core.model import Model
from bucketserve.core.quantize import Calibration
from bucketserve.core.task import Task
from bucketserve.core.tasks.embedding import Embedding
from bucketserve.errors import ConfigError
from bucketserve.loading.fingerprint import PREFIX
from bucketserve.loading.repository import ModelSpec
from bucketserve.loading.traffic import Texts

log = logging.getLogger(__name__)

GENERATED_TEXTS = 256
# Texts of 8 to 128 tokens: a pooled vector's spread narrows as a text grows, so ranges from
# shorter texts hold longer ones' too; and the fit costs a load a second on minilm's size
# (3.8 s with texts up to its 256).
LONGEST_GENERATED = 128
SEED = 20


def calibrated(model: Model, spec: ModelSpec, cache_dir: Path) -> Calibration | None:
    """The model's calibration (None: it embeds no texts), from the cache or fitted now."""
    rule: Embedding | None = model.info.rule(Task.EMBED)
    if rule is None or model.tokenizer is None:
        return None
    named = spec.config.embedding.calibration if spec.config.embedding is not None else None
    cached = cache_dir / f"calibration-{model.info.fingerprint.removeprefix(PREFIX)[:32]}.npz"
    if cached.is_file():
        kept = np.load(cached)
        return Calibration(kept["low"], kept["high"], int(kept["texts"]), str(kept["source"]))
    if named is not None:
        path = spec.onnx_path.parent / named
        try:
            texts = [t for t in path.read_text(encoding="utf-8").splitlines() if t.strip()]
        except OSError as exc:
            raise ConfigError(f"{path}: [embedding] calibration: {exc.strerror}") from None
        if not texts:
            raise ConfigError(f"{path}: [embedding] calibration: no texts in it")
        sequences = model.encode(texts)
    else:
        rng = np.random.default_rng(SEED)
        longest = min(model.info.rules.max_length, LONGEST_GENERATED)
        lengths = rng.integers(min(8, longest), longest + 1, GENERATED_TEXTS).tolist()
        sequences = Texts(model.tokenizer, model.info.rules, pairs=False)(lengths, SEED)
    outputs = model.predict(sequences)
    vectors = np.stack([rule.vector(out[rule.output]) for out in outputs])
    calibration = Calibration.fitted(vectors, named or "generated")
    cache_dir.mkdir(parents=True, exist_ok=True)
    written = cached.with_suffix(".tmp.npz")
    np.savez(written, low=calibration.low, high=calibration.high,
             texts=calibration.texts, source=calibration.source)  # fmt: skip
    written.replace(cached)
    return calibration
