"""Per-model configuration: `models/<name>/config.toml`, parsed and validated at start.

This is an edge of the system (a file written by people), so it is pydantic; every error names
the file and the field. What the config says about the graph (input names, output names) is
checked against the ONNX file by `signature`.
"""

from __future__ import annotations

import tomllib
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bucketserve.core.layout import SEQUENCE_ROLES, InputRole
from bucketserve.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputConfig(_Strict):
    role: InputRole
    vocab_size: int | None = Field(
        default=None, gt=0, description="tokens: ids lie in [0, vocab_size)"
    )
    pad_value: float = Field(
        default=0,
        description="tokens/features: value at padded positions; mask: its value at padding "
        "(0: ones on real steps, as Hugging Face's attention_mask; 1: a mask set at padding, "
        "as `ids == pad_id` makes; found at load when not given)",
    )
    reserved_ids: list[int] | None = Field(
        default=None,
        description="tokens: ids refused inside a sequence; default: the pad id when no mask "
        "or lengths input tells the model where padding is (then the pad id is its mask)",
    )
    fill: float = Field(default=0.0, description="state: the value the state is filled with")
    value: float | None = Field(
        default=None, description="constant: the value fed on every run (a sample rate)"
    )
    shape: list[int] | None = Field(
        default=None,
        description="the input's dims, -1 where the graph's stay (the batch and time axes): "
        "fixes a dim the graph leaves free (an image's height); default: the graph's",
    )
    batch_axis: int | None = Field(
        default=None, ge=0, description="the batch axis; default: found from the graph and role"
    )
    time_axis: int | None = Field(
        default=None, ge=0, description="the time axis; default: found from the graph and role"
    )

    @model_validator(mode="after")
    def _tokens_need_vocab(self) -> InputConfig:
        if self.shape is not None and any(d == 0 or d < -1 for d in self.shape):
            raise ValueError("shape: each dim is a size, or -1 to keep the graph's")
        if (self.role is InputRole.CONSTANT) != (self.value is not None):
            raise ValueError("a constant input needs its value, and only a constant takes one")
        if self.role is InputRole.MASK and self.pad_value not in (0, 1):
            raise ValueError("a mask's pad_value is 0 (ones on real steps) or 1 (set at padding)")
        if self.role is not InputRole.TOKENS:
            if self.reserved_ids is not None:
                raise ValueError("reserved_ids are for a tokens input")
            return self
        if self.vocab_size is None:
            raise ValueError("a tokens input needs vocab_size (ids are checked against it)")
        ids = [self.pad_value, *(self.reserved_ids or [])]
        if any(i != int(i) or not 0 <= i < self.vocab_size for i in ids):
            raise ValueError(f"pad_value and reserved_ids must be ids in [0, {self.vocab_size})")
        return self


class OutputConfig(_Strict):
    per_step: bool | None = Field(
        default=None,
        description="has a time axis, cut to each length; default: found from the graph",
    )
    batch_axis: int | None = Field(
        default=None, ge=0, description="the batch axis; default: found from the graph"
    )
    time_axis: int | None = Field(
        default=None, ge=0, description="the time axis (per-step outputs); with batch_axis"
    )

    @model_validator(mode="after")
    def _axes_agree(self) -> OutputConfig:
        if self.time_axis is not None and self.batch_axis is None:
            raise ValueError("time_axis needs batch_axis too")
        known = self.batch_axis is not None and self.per_step is not None
        if known and self.per_step != (self.time_axis is not None):
            raise ValueError("per_step = true needs a time_axis, per_step = false none")
        return self


class BatchingConfig(_Strict):
    buckets: list[int] | Literal["auto"] = Field(
        description="bucket edges (the lengths keys pad to), or 'auto': fitted at load to "
        "length_sample by the planner"
    )
    length_sample: str | None = Field(
        default=None, description="auto: lengths file (one per line) in the model folder"
    )
    bucket_count: int = Field(default=12, gt=0, description="auto: how many keys to fit")
    max_length: int | None = Field(default=None, gt=0, description="auto: the last edge")
    max_batch_size: int = Field(default=16, gt=0)
    max_batch_tokens: int = Field(default=4096, gt=0, description="rows x bucket length, at most")
    max_queue_delay_ms: float = Field(default=5.0, ge=0)
    queue_capacity: int = Field(default=1024, gt=0, description="sequences waiting, at most")
    prepare: Literal["default", "all"] = Field(
        default="default", description="keys bound at load: the default key only, or all keys"
    )
    policy: Literal["auto", "buckets", "exact-length", "single"] = Field(
        default="auto",
        description="auto: chosen by the invariance check at load; or set it: buckets, "
        "exact-length (equal lengths only, unpadded) or single (one sequence per run)",
    )
    tolerance: float = Field(
        default=1e-4,
        gt=0,
        description="the most batching may move an answer: |batched - alone| / (1 + |alone|)",
    )

    @field_validator("buckets")
    @classmethod
    def _increasing(cls, edges: list[int] | str) -> list[int] | str:
        if isinstance(edges, str):
            return edges
        if not edges:
            raise ValueError("at least one bucket edge is needed")
        if any(e <= 0 for e in edges):
            raise ValueError("bucket edges must be positive")
        if any(b <= a for a, b in pairwise(edges)):
            raise ValueError("bucket edges must be strictly increasing")
        return edges

    @model_validator(mode="after")
    def _budget_fits_longest(self) -> BatchingConfig:
        if self.buckets == "auto" and (self.length_sample is None or self.max_length is None):
            raise ValueError("buckets = 'auto' needs length_sample and max_length")
        longest = self.longest
        if self.max_batch_tokens < longest:
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) is smaller than the longest "
                f"bucket ({longest}): that bucket could never hold a sequence"
            )
        return self

    @property
    def longest(self) -> int:
        if isinstance(self.buckets, list):
            return self.buckets[-1]
        assert self.max_length is not None
        return self.max_length

    @property
    def edges(self) -> list[int]:
        """The resolved edges; 'auto' is replaced by fitted edges when the model is loaded."""
        if not isinstance(self.buckets, list):
            raise RuntimeError("bucket edges not fitted yet")
        return self.buckets


class TokenizerConfig(_Strict):
    file: str = "tokenizer.json"
    max_length: int = Field(
        default=256, gt=0, description="texts are truncated to this many tokens"
    )
    max_chars: int | None = Field(
        default=None,
        gt=0,
        description="texts are cut to this many characters before tokenising, so that one "
        "request's cost is bounded; default 32 x max_length, past any text max_length allows",
    )
    long_inputs: Literal["truncate", "windows"] = Field(
        default="truncate",
        description="a text longer than max_length: cut (truncate), or embedded whole in "
        "windows of max_length whose vectors are averaged (windows); a request may say",
    )
    window_overlap: int = Field(
        default=0, ge=0, description="windows: the tokens each window shares with the one before"
    )

    @property
    def chars(self) -> int:
        return self.max_chars or 32 * self.max_length


class EmbeddingConfig(_Strict):
    """Which output is the model's embedding, for the routes that answer embeddings (OpenAI's
    /v1/embeddings)."""

    output: str = Field(description="the output that holds it")
    pooling: Literal["none", "mean", "cls", "last", "max", "mean_sqrt_len"] = Field(
        default="none",
        description="none: the output is one vector per sequence already; otherwise how a "
        "per-step output's steps (the sequence's own, never padding) become one vector",
    )
    normalize: bool = Field(default=False, description="L2-normalise the vector")
    dimensions: list[int] | Literal["any"] | None = Field(
        default=None,
        description="the widths a request may cut it to (then normalised again), or 'any' "
        "(Matryoshka-trained); default: it may not be cut",
    )
    calibration: str | None = Field(
        default=None,
        description="a file of texts, one a line, in the version's folder, whose vectors' "
        "ranges int8 and uint8 answers scale to; default: texts drawn from the tokenizer",
    )
    answer_type: Literal["float", "int8", "uint8", "binary", "ubinary"] = Field(
        default="float",
        description="the type OpenAI's and Infinity's embeddings routes answer (Infinity's "
        "--embedding-dtype): int8 and uint8 over the calibrated ranges, binary and ubinary "
        "the packed signs; Cohere's embedding_types still choose their own",
    )

    @field_validator("dimensions")
    @classmethod
    def _positive(cls, widths: list[int] | str | None) -> list[int] | str | None:
        if isinstance(widths, list) and (not widths or min(widths) <= 0):
            raise ValueError("dimensions are positive widths (at least one)")
        return widths


class ClassifierConfig(_Strict):
    """Which output holds one row of logits per sequence, for the routes that classify
    (/classify) and rerank (/rerank, /v1/rerank, /v2/rerank)."""

    output: str = Field(description="the output that holds the logits, one row per sequence")
    labels: list[str] | None = Field(
        default=None,
        min_length=1,
        description="the labels' names in the logits' order (id2label); default LABEL_0...",
    )
    activation: Literal["softmax", "sigmoid", "none"] | None = Field(
        default=None,
        description="how logits become scores: softmax (one label of several), sigmoid (each "
        "label on its own), none; default sigmoid for one label, softmax for more",
    )
    rerank_label: int | None = Field(
        default=None,
        ge=0,
        description="the label whose score is a (query, document) pair's relevance: set, the "
        "model reranks (a cross-encoder with one label: 0)",
    )


class TokenClassifierConfig(_Strict):
    """Which per-token output holds each token's logits, for /classify_tokens (a tagger, NER)."""

    output: str = Field(description="the per-token output of logits over the labels")
    labels: list[str] | None = Field(
        default=None, min_length=1, description="the labels' names in order (id2label)"
    )
    activation: Literal["softmax", "sigmoid", "none"] = Field(
        default="softmax", description="how a token's logits become its labels' scores"
    )


class SparseConfig(_Strict):
    """Which per-token output gives sparse weights, for /embed_sparse: SPLADE's masked-LM
    logits [T, vocabulary], or a weight per token (BGE-M3's sparse head, [T] or [T, 1])."""

    output: str = Field(description="the per-token output")
    pooling: Literal["splade", "token_weights"] = Field(
        default="splade",
        description="splade: the largest log(1 + relu(logit)) of each vocabulary entry over "
        "the tokens; token_weights: each token id's largest relu(weight)",
    )


class MultiVectorConfig(_Strict):
    """Which per-token output is one vector per token, for /embed_all (ColBERT's projection);
    without this section a per-token [embedding] output is served as it is."""

    output: str = Field(description="the per-token output")
    normalize: bool = Field(default=False, description="L2-normalise each token's vector")


class VersionPolicy(_Strict):
    """Which version folders are served at once (Triton's version policy); one of the three."""

    latest: int | None = Field(default=None, gt=0, description="the newest N")
    all: bool | None = Field(default=None, description="every version folder")
    specific: list[int] | None = Field(default=None, min_length=1, description="these versions")

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        given = [n for n in ("latest", "all", "specific") if getattr(self, n) not in (None, False)]
        if len(given) != 1:
            raise ValueError("give exactly one of latest = N, all = true, specific = [...]")
        return self


class ModelConfig(_Strict):
    version: int | None = Field(default=None, description="version folder; default: the newest")
    version_policy: VersionPolicy | None = Field(
        default=None, description="several versions at once (default: the one above)"
    )
    mode: Literal["bucketing", "mutable"] = "bucketing"
    binding: Literal["shared-session", "session-per-key"] = "shared-session"
    providers: list[str] = Field(default=["CPUExecutionProvider"], min_length=1)
    provider_options: dict[str, dict[str, str | int | float | bool]] = Field(
        default_factory=dict,
        description="each provider's options, by its name, as ONNX Runtime takes them (say "
        "[provider_options.CUDAExecutionProvider] device_id = 1). CUDA's use_tf32 is 0 unless "
        "set here: TF32 matrix products change answers with a batch's shape (1.8e-3 measured "
        "on an H100), and the check would then serve one sequence per run",
    )
    inputs: dict[str, InputConfig] = Field(min_length=1)
    outputs: dict[str, OutputConfig] = Field(min_length=1)
    batching: BatchingConfig
    tokenizer: TokenizerConfig | None = None
    embedding: EmbeddingConfig | None = None
    classifier: ClassifierConfig | None = None
    token_classifier: TokenClassifierConfig | None = None
    sparse: SparseConfig | None = None
    multi_vector: MultiVectorConfig | None = None
    aliases: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="other names the model answers to: a vendor's default name its clients "
        "send (rerank-v3.5, text-embedding-3-small), so they work unchanged",
    )
    prompts: dict[str, str] | None = Field(
        default=None,
        description="named texts put before a request's texts when it asks for one by "
        "prompt_name (sentence-transformers' prompts: e5's query = 'query: ')",
    )
    build: str | None = Field(
        default=None, description="`bucketserve models build` recipe that makes this model's files"
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "pad_sensitive" in data:
            raise ValueError(
                "pad_sensitive is now measured at load; to set it yourself, write "
                "batching.policy = 'exact-length' (for true) or 'auto'"
            )
        return data

    @model_validator(mode="after")
    def _roles(self) -> ModelConfig:
        sequence = [n for n, i in self.inputs.items() if i.role in SEQUENCE_ROLES]
        if len(sequence) != 1:
            raise ValueError(
                "exactly one input must have role 'tokens' or 'features'; "
                f"found {sequence or 'none'}"
            )
        own = [n for n, i in self.inputs.items() if i.role is InputRole.ROW_LENGTHS]
        if own:
            raise ValueError(
                f"inputs.{own[0]}: role 'row_lengths' is the server's own (an input it adds "
                "to a copy it rewrites); a lengths input the model has is role 'lengths'"
            )
        for role in (InputRole.MASK, InputRole.LENGTHS):
            named = [n for n, i in self.inputs.items() if i.role is role]
            if len(named) > 1:
                raise ValueError(f"at most one input may have role '{role.value}'; found {named}")
        unlisted = [p for p in self.provider_options if p not in self.providers]
        if unlisted:
            raise ValueError(f"provider_options.{unlisted[0]}: not one of providers")
        if self.tokenizer is not None and self.inputs[sequence[0]].role is not InputRole.TOKENS:
            raise ValueError("a tokenizer needs a 'tokens' input")
        if self.prompts and self.tokenizer is None:
            raise ValueError("prompts are put before texts: name the model's [tokenizer]")
        if self.version is not None and self.version_policy is not None:
            raise ValueError("give version or version_policy, not both")
        heads = {
            "embedding": self.embedding,
            "classifier": self.classifier,
            "token_classifier": self.token_classifier,
            "sparse": self.sparse,
            "multi_vector": self.multi_vector,
        }
        for section, head in heads.items():
            if head is not None and head.output not in self.outputs:
                raise ValueError(
                    f"{section}.output {head.output!r} is not one of the outputs "
                    f"{sorted(self.outputs)}"
                )
        return self

    @property
    def sequence_input(self) -> str:
        return next(n for n, i in self.inputs.items() if i.role in SEQUENCE_ROLES)


def load_model_config(path: Path) -> ModelConfig:
    """Read and validate one config.toml; any problem raises ConfigError naming file and field."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return ModelConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"{path}: {problems}") from None
