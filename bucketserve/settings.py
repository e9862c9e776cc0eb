"""Server settings: one frozen object, built once at start and passed down.

Precedence: command-line flag > `BUCKETSERVE_*` environment variable > default. Nothing reads
the environment at import time; `Settings.from_env` is called by the CLI. Each field's help
text is the CLI's `--help`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bucketserve.errors import ConfigError

log = logging.getLogger(__name__)

ENV_PREFIX = "BUCKETSERVE_"
BINDINGS = ("shared-session", "session-per-key", "mutable")
# Old spellings users may still send, each the alias of a setting's name now.
DEPRECATED = {"strategy": "binding"}
MODEL_CONTROL = ("none", "explicit", "poll")
# The level of bulk jobs' work: after every level a request may ask for, never promoted
BULK_LEVEL = 99


@dataclass(frozen=True)
class Settings:
    models: Path = field(default=Path("models"), metadata={"help": "model repository folder"})
    model_name: str | None = field(
        default=None,
        metadata={
            "help": "the name to serve a single model's folder under (--models holding its "
            "config.toml, as KServe's storage initializer leaves /mnt/models; default: the "
            "folder's name)"
        },
    )
    host: str = field(
        default="127.0.0.1", metadata={"help": "address to listen on (0.0.0.0 in a container)"}
    )
    port: int = field(default=8000, metadata={"help": "port to listen on"})
    grpc_port: int | None = field(
        default=None,
        metadata={
            "help": "also serve KServe v2 over gRPC on this port (the grpc extra; Triton's is 8001)"
        },
    )
    default_model: str | None = field(
        default=None,
        metadata={"help": "model for requests that name none (default: the repository's choice)"},
    )
    served_model_name: str | None = field(
        default=None,
        metadata={
            "help": "other names models answer to, as text-embeddings-inference's flag names "
            "its model: ALIAS=MODEL, comma-separated (ALIAS alone: the default model), so that "
            "a client sending a vendor's default name works unchanged (a model's config may "
            "name its own: aliases = [...])"
        },
    )
    request_timeout_ms: int = field(
        default=30_000,
        metadata={"help": "deadline of a request; X-Request-Timeout-Ms can only shorten it"},
    )
    max_body_bytes: int = field(
        default=8 * 2**20, metadata={"help": "largest request body accepted (413 above)"}
    )
    max_sequences: int = field(
        default=256, metadata={"help": "most sequences in one request (422 above)"}
    )
    max_request_tokens: int = field(
        default=65_536,
        metadata={"help": "most tokens (or steps) in one request, all sequences together (422)"},
    )
    drain_timeout_s: float = field(
        default=30.0,
        metadata={
            "help": "on SIGTERM, the longest wait for admitted requests and for idle "
            "connections to be left by their clients, before exiting"
        },
    )
    header_timeout_s: float = field(
        default=10.0,
        metadata={"help": "a request's headers must arrive within this of its first byte"},
    )
    body_timeout_s: float = field(
        default=30.0, metadata={"help": "a request's body must arrive within this of its headers"}
    )
    keep_alive_s: int = field(
        default=75,
        metadata={
            "help": "an idle connection stays open this long (longer than client pools keep "
            "theirs, so that the client closes first)"
        },
    )
    max_connections: int = field(
        default=1000,
        metadata={"help": "open connections at most; a request on one more gets 503"},
    )
    binding: str | None = field(
        default=None,
        metadata={
            "help": "override every model's binding: shared-session, session-per-key or mutable"
        },
    )
    strategy: str | None = field(
        default=None, metadata={"help": "deprecated: the old name of --binding"}
    )
    max_batch_size: int | None = field(
        default=None,
        metadata={"help": "override every model's max_batch_size (1 turns batching off)"},
    )
    buckets: str | None = field(
        default=None,
        metadata={"help": "override every model's bucket edges, e.g. 16,32,64 (benchmarks)"},
    )
    max_queue_delay_ms: float | None = field(
        default=None, metadata={"help": "override every model's max_queue_delay_ms"}
    )
    instances: int | None = field(
        default=None,
        metadata={
            "help": "batches of one model that run at once, each in its own thread (default: "
            "one per core when every model runs on the CPU, else 1)"
        },
    )
    intra_op_threads: int | None = field(
        default=None,
        metadata={"help": "ONNX Runtime threads for one batch (default: cores / instances)"},
    )
    lone_batch_threads: int | None = field(
        default=None,
        metadata={
            "help": "ONNX Runtime threads for a batch that runs alone (no other running or "
            "waiting), on a second session with its own copy of the weights (default: every "
            "core, where each batch runs on one thread; 1 turns it off)"
        },
    )
    memory_budget: str | None = field(
        default=None,
        metadata={
            "help": "the memory every batch running at once may need together, e.g. 6GiB or "
            "1500MiB (default: the container's memory limit, else the machine's memory, less "
            "what is held at start, twice the models' files and a reserve for the request "
            "path): a batch waits until it fits; a sequence whose batch of one cannot fit is "
            "refused (413), and no load-time check runs one"
        },
    )
    cache_dir: Path | None = field(
        default=None,
        metadata={
            "help": "where a session-per-key model's weights are written out once, for its "
            "sessions to share (default: $XDG_CACHE_HOME/bucketserve, else ~/.cache/bucketserve)"
        },
    )
    model_control: str = field(
        default="none",
        metadata={
            "help": "none: the models of the start are served until the end; explicit: also "
            "loaded, replaced and unloaded by KServe's repository extension (POST "
            "/v2/repository/models/NAME/load, /unload; gRPC RepositoryModelLoad...); poll: "
            "explicit, and the repository folder followed every --poll-interval-s"
        },
    )
    poll_interval_s: float = field(
        default=5.0, metadata={"help": "model_control poll: how often the folder is read"}
    )
    allow_partial: bool = field(
        default=False,
        metadata={
            "help": "serve the models that load when others fail (those report not ready, "
            "with their error); without it, a model that fails to load stops the server"
        },
    )
    locked: bool = field(
        default=False,
        metadata={
            "help": "serve only model versions whose content matches their fingerprint in the "
            "repository's bucketserve.lock (`bucketserve models lock` writes it), at start and "
            "under model control"
        },
    )
    docs: bool = field(
        default=False,
        metadata={
            "help": "serve interactive API docs at /docs, their assets from this server (the "
            "docs extra); the OpenAPI document is always at /openapi.json"
        },
    )
    auto_truncate: bool = field(
        default=True,
        metadata={
            "help": "cut a text longer than the model takes where the request does not say "
            "(`truncate` left out, as text-embeddings-inference's --auto-truncate); off: such "
            "a text is refused (422) unless the request asks for the cut"
        },
    )
    openai_token_ids: bool = field(
        default=False,
        metadata={
            "help": "read token ids sent to /v1/embeddings as the model's own ids, for a model "
            "that takes text (by default refused: OpenAI's clients send ids of OpenAI's own "
            "tokenizer, which another model would read as other tokens)"
        },
    )
    api_key: str | None = field(
        default=None,
        repr=False,  # (never in a log line or a traceback)
        metadata={
            "help": "require this key as `Authorization: Bearer KEY` (gRPC: `authorization` "
            "metadata) on every route but health and readiness; prefer the environment "
            "variable or --api-key-file to a flag, which other users can see in ps"
        },
    )
    api_key_file: Path | None = field(
        default=None,
        metadata={
            "help": "a file of API keys, one a line (# comments), any of which is accepted: "
            "rotate by adding the new key, then removing the old; a line may be a tenant's "
            "name then its key, and end in `gateway` for a key that may name tenants in "
            "--tenant-header"
        },
    )
    priority_levels: int = field(
        default=3,
        metadata={
            "help": "priority levels a request may ask for, 1 (first) to this (`priority` in "
            "a body or v2's parameters, X-Priority over HTTP, x-priority gRPC metadata); "
            "1 makes every request equal"
        },
    )
    default_priority: int = field(
        default=2,
        metadata={"help": "the level of a request that asks for none (or for 0, as Triton's)"},
    )
    max_overtakes: int = field(
        default=16,
        metadata={
            "help": "how often a waiting sequence may be passed over for a better level; then "
            "it goes first, so bulk work always moves"
        },
    )
    jobs_dir: Path | None = field(
        default=None,
        metadata={
            "help": "where bulk jobs keep their files and state (OpenAI's Files and Batch API; "
            "default: $XDG_DATA_HOME/bucketserve/jobs, else ~/.local/share/bucketserve/jobs)"
        },
    )
    max_file_mb: float = field(
        default=512, metadata={"help": "the largest file a batch may upload, in MiB"}
    )
    max_files: int = field(default=100, metadata={"help": "files a tenant may keep"})
    max_jobs: int = field(
        default=8, metadata={"help": "batches a tenant may have unfinished at once"}
    )
    tenant_header: str | None = field(
        default=None,
        metadata={
            "help": "the header (gRPC: metadata) naming a request's tenant, set by a gateway "
            "you trust, honoured for its keys only (`gateway` in --api-key-file; with no "
            "key marked, for keys of one tenant) (default: the API key's name)"
        },
    )
    tenant_weights: str | None = field(
        default=None,
        metadata={
            "help": "tenants' weights, e.g. search=4,indexer=1: each tenant waiting gets this "
            "part of a contended model's tokens and queue (others weigh 1); named tenants "
            "are labelled in the metrics, the rest as `other`"
        },
    )
    result_cache_mb: float = field(
        default=64.0,
        metadata={
            "help": "each model version's exact result cache, at most this many MiB (0: off); "
            "only for models whose check proved batching and padding change no answer"
        },
    )
    open_metrics: bool = field(
        default=False,
        metadata={"help": "with an API key: leave /metrics open to scrapers without it"},
    )
    otlp_endpoint: str | None = field(
        default=None,
        metadata={
            "help": "send traces over OTLP/HTTP to this collector, e.g. http://collector:4318 "
            "(the tracing extra; the standard OTEL_EXPORTER_OTLP_* variables work too)"
        },
    )
    log_json: bool = field(default=False, metadata={"help": "log JSON lines instead of text"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})

    def __post_init__(self) -> None:
        if self.model_control not in MODEL_CONTROL:
            raise ConfigError(
                f"model_control: {self.model_control!r} is not one of {', '.join(MODEL_CONTROL)}"
            )
        if self.poll_interval_s <= 0:
            raise ConfigError(f"poll_interval_s: must be positive, got {self.poll_interval_s}")
        for old, new in DEPRECATED.items():
            self._take_alias(old, new)
        if self.binding is not None and self.binding not in BINDINGS:
            raise ConfigError(f"binding: {self.binding!r} is not one of {', '.join(BINDINGS)}")
        for name in (
            "port",
            "request_timeout_ms",
            "max_body_bytes",
            "max_sequences",
            "max_request_tokens",
            "header_timeout_s",
            "body_timeout_s",
            "keep_alive_s",
            "max_connections",
        ):
            if getattr(self, name) <= 0 and not (name == "port" and self.port == 0):
                raise ConfigError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError(
                "api_key: empty: an empty key would leave every route open; unset "
                f"{env_name('api_key')} to run without a key, or set one"
            )
        for name in ("instances", "intra_op_threads", "lone_batch_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be at least 1, got {getattr(self, name)}")
        if self.buckets is not None and not all(
            e.strip().isdigit() for e in self.buckets.split(",")
        ):
            raise ConfigError(f"buckets: expected comma-separated lengths, got {self.buckets!r}")
        if not 1 <= self.priority_levels < BULK_LEVEL:
            raise ConfigError(f"priority_levels: 1 to {BULK_LEVEL - 1} (bulk jobs run after them)")
        if not 1 <= self.default_priority <= self.priority_levels:
            raise ConfigError(
                f"default_priority: {self.default_priority} is not a level of 1 to "
                f"priority_levels ({self.priority_levels})"
            )
        if self.max_file_mb <= 0 or self.max_files < 1 or self.max_jobs < 1:
            raise ConfigError("max_file_mb, max_files and max_jobs: must be above 0")
        if self.max_overtakes < 0 or self.result_cache_mb < 0:
            raise ConfigError("max_overtakes and result_cache_mb: must be 0 or more")
        if self.tenant_header is not None and not _token(self.tenant_header):
            raise ConfigError(f"tenant_header: {self.tenant_header!r} is not a header name")
        self.weights()  # (checked now, not at the first request)
        self.memory_budget_bytes()
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ConfigError(f"max_batch_size: must be at least 1, got {self.max_batch_size}")

    def _take_alias(self, old: str, new: str) -> None:
        """An old spelling still works, said once in the log; both given must agree."""
        given = getattr(self, old)
        if given is None:
            return
        log.warning(
            "%s (%s) is deprecated: use %s (%s)",
            "--" + old.replace("_", "-"),
            env_name(old),
            "--" + new.replace("_", "-"),
            env_name(new),
        )
        if getattr(self, new) not in (None, given):
            raise ConfigError(f"{old}: {given!r} contradicts {new}: {getattr(self, new)!r}")
        object.__setattr__(self, new, given)
        object.__setattr__(self, old, None)

    def api_keys(self) -> dict[str, str]:
        """Every key a request may carry, with its tenant's name (none: no key is required),
        read once at start. A line of the key file is a key, or a name then its key: the
        name is the tenant, which owns what its keys make (two keys of one name, during a
        rotation, are one tenant). Keys without a name are one tenant, "" (a server's
        without keys): a rotation of unnamed keys keeps what they made; name the keys of
        clients that must not see each other's files."""
        return {key: name for name, key, _ in self._key_lines()}

    def gateway_keys(self) -> frozenset[str]:
        """The keys whose line ends in `gateway`: a gateway's, which may name a request's
        tenant in --tenant-header."""
        marked = frozenset(key for _, key, gateway in self._key_lines() if gateway)
        if marked and self.tenant_header is None:
            raise ConfigError(
                f"api_key_file: {self.api_key_file}: a `gateway` key names tenants in a "
                "header: set --tenant-header"
            )
        return marked

    def _key_lines(self) -> list[tuple[str, str, bool]]:
        """(tenant, key, whether a gateway's) of --api-key and each line of the key file."""
        named = [("", self.api_key, False)] if self.api_key else []
        if self.api_key_file is not None:
            try:
                lines = self.api_key_file.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"api_key_file: {self.api_key_file}: {exc}") from None
            found = [k.split() for k in lines if k.strip() and not k.lstrip().startswith("#")]
            if not found:
                raise ConfigError(f"api_key_file: {self.api_key_file} holds no key")
            if any(len(w) > 3 or (len(w) == 3 and w[2] != "gateway") for w in found):
                raise ConfigError(
                    f"api_key_file: {self.api_key_file}: a line is a key, or a name and a key "
                    "(then `gateway`, for a gateway's key)"
                )
            named += [
                ("", w[0], False) if len(w) == 1 else (w[0], w[1], len(w) == 3) for w in found
            ]
        if any(not key.isascii() or not key.isprintable() or " " in key for _, key, _ in named):
            raise ConfigError("api_key: a key is printable ASCII without spaces")
        return named

    def memory_budget_bytes(self) -> int | None:
        """--memory-budget in bytes (None when not given): a number of bytes, or one with a
        unit (KiB, MiB, GiB, TiB, or K, M, G, T for the same; KB, MB, GB, TB in powers of
        ten)."""
        if self.memory_budget is None:
            return None
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*", self.memory_budget, re.I)
        if found is None:
            raise ConfigError(
                f"memory_budget: {self.memory_budget!r}: expected a size such as 6GiB, 1500MiB "
                "or a number of bytes"
            )
        number, unit, suffix = float(found[1]), found[2].upper(), found[3].upper()
        power = "KMGT".find(unit) + 1 if unit else 0
        base = 1000 if suffix == "B" and unit else 1024
        size = int(number * base**power)
        if size <= 0:
            raise ConfigError(f"memory_budget: {self.memory_budget!r}: must be above 0")
        return size

    def weights(self) -> dict[str, float]:
        """The tenants' weights --tenant-weights names."""
        weights: dict[str, float] = {}
        for part in filter(None, (self.tenant_weights or "").split(",")):
            name, _, weight = part.strip().partition("=")
            try:
                weights[name] = float(weight)
            except ValueError:
                weights[name] = -1.0
            if not name or not weights[name] > 0 or weights[name] == float("inf"):
                raise ConfigError(
                    f"tenant_weights: {part.strip()!r}: expected name=weight, a positive number"
                )
        return weights

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then BUCKETSERVE_* variables, then `overrides` that are not None."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(env_name(f.name))
            if raw is not None:
                values[f.name] = parse_value(f.name, str(f.type), raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _token(name: str) -> bool:
    """Whether `name` may be an HTTP header's name (and so gRPC metadata's)."""
    return bool(name) and all(c.isascii() and (c.isalnum() or c in "-_") for c in name)


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def parse_value(name: str, type_name: str, raw: str) -> Any:
    """One text value converted to the field's type; errors name the variable."""
    try:
        if "Path" in type_name:
            return Path(raw)
        if "bool" in type_name:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError("expected true or false")
            return raw.lower() in ("1", "true", "yes")
        if "int" in type_name:
            return int(raw)
        if "float" in type_name:
            return float(raw)
        return raw
    except ValueError as exc:
        raise ConfigError(f"{env_name(name)}={raw!r}: {exc}") from None
