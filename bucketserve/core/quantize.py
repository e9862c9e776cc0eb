"""Embeddings in the types vector stores keep (Cohere's `embedding_types`): floats; `int8` and
`uint8`, each dimension scaled to 256 steps over the range the model's calibration found for
it (`Calibration`, fitted at load); `binary` and `ubinary`, the signs (a value above 0 is a 1)
packed eight dimensions to a byte, the first dimension in the byte's highest bit, `binary` as
that byte less 128. The same arithmetic as sentence-transformers' `quantize_embeddings` (each
value floored to its step; values outside the calibrated range held at its ends). Applied by
the edges to a request's vectors, as the `Embed` head answered them; below the tasks (the
embedding's rule holds its `Calibration`), imports nothing of the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from bucketserve.errors import InvalidInput

STEPS = 255  # int8 and uint8: the range cut into this many steps


class EmbeddingType(StrEnum):
    FLOAT = "float"
    INT8 = "int8"
    UINT8 = "uint8"
    BINARY = "binary"
    UBINARY = "ubinary"


SCALED = (EmbeddingType.INT8, EmbeddingType.UINT8)  # the types scaled over calibrated ranges


@dataclass(frozen=True)
class Calibration:
    """Each dimension's range over a model's calibration texts: what int8 and uint8 scale."""

    low: np.ndarray  # [width] float32
    high: np.ndarray  # [width] float32
    texts: int  # how many texts it was fitted on
    source: str  # "generated" (texts drawn from the tokenizer's vocabulary), or the file's name

    @classmethod
    def fitted(cls, vectors: np.ndarray, source: str) -> Calibration:
        return cls(vectors.min(axis=0), vectors.max(axis=0), len(vectors), source)

    def described(self) -> dict[str, object]:
        """As the model's metadata reports it."""
        return {
            "texts": self.texts,
            "source": self.source,
            "ranges": [self.low.tolist(), self.high.tolist()],
        }


def quantized(
    vectors: np.ndarray,
    kind: EmbeddingType,
    calibration: Calibration | None,
    param: str = "embedding_types",
) -> np.ndarray:
    """`vectors` [n, width] float32 as `kind`: float32, int8 or uint8 [n, width], or the
    packed signs [n, ceil(width / 8)] as int8 (binary) or uint8 (ubinary). `param`: the
    request's field a refusal blames (the one that asked for the type, or for a cut)."""
    if kind is EmbeddingType.FLOAT:
        return vectors
    if kind in (EmbeddingType.BINARY, EmbeddingType.UBINARY):
        packed = np.packbits(vectors > 0, axis=-1)  # (big-endian bits: the first dimension high)
        return (
            packed
            if kind is EmbeddingType.UBINARY
            else (packed.astype(np.int16) - 128).astype(np.int8)
        )
    if calibration is None:
        raise InvalidInput(
            f"{kind.value}: this model has no calibration of its ranges (served with its "
            "embedding's calibration off); ask for float, binary or ubinary",
            param=param,
        )
    if vectors.shape[-1] != len(calibration.low):
        raise InvalidInput(
            f"{kind.value} is calibrated on the whole vector ({len(calibration.low)} "
            "dimensions): leave the dimensions out",
            param=param,
        )
    steps = (calibration.high - calibration.low) / STEPS
    scaled = np.clip(
        np.floor((vectors - calibration.low) / np.where(steps > 0, steps, 1)), 0, STEPS
    )
    if kind is EmbeddingType.UINT8:
        return np.asarray(scaled, np.float32).astype(np.uint8)
    return np.asarray(scaled - 128, np.float32).astype(np.int8)
