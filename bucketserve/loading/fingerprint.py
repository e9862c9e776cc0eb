"""A served model version's fingerprint: one digest of what makes its answers, so that a user
who keeps answers (vectors in a store) can tell when the model behind a name and version
changed. Read at load from the repository's files, before any copy the server serves from:

- every file the model reads, and no other: the graph, each external data file its tensors
  name (any name, a hidden one too), the tokenizer; each by the path the graph or the config
  gives and its content's digest, read where that path leads (a folder that is a symlink
  included), so that bytes changed in place change it whatever their size and time;
- the config's fields that change an answer: inputs, outputs, tokenizer, the task sections
  (embedding, classifier, sparse...), prompts, providers and their options, and the batching
  policy and tolerance the config asks for; not those that change only how it is served
  (bucket edges, batch sizes, queue, binding, aliases, version policy).

The same content gives the same fingerprint on every machine and after every restart (paths
are relative, the config is read as parsed): the check's verdict at load, which may differ by
machine, is not part of it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from bucketserve.loading.digests import Digests
from bucketserve.loading.repository import ModelSpec

PREFIX = "sha256:"
# The config's fields that change only how a model is served, never an answer
SERVING_ONLY = {"version", "version_policy", "mode", "binding", "aliases", "build"}
ANSWERING_BATCHING = ("policy", "tolerance")  # of [batching]: what the check may serve


def fingerprint_of(spec: ModelSpec, digests: Digests | None = None) -> str:
    """`spec`'s fingerprint: `sha256:` and the hex digest of its files and answering config."""
    digests = digests or Digests()
    content = {
        "files": {name: digests.of(path) for name, path in sorted(read_files(spec).items())},
        "config": answering_config(spec),
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return PREFIX + hashlib.sha256(canonical.encode()).hexdigest()


def read_files(spec: ModelSpec) -> dict[str, Path]:
    """The files the model reads, by the names the fingerprint gives them: their paths in
    the version's folder as the graph and the config write them (so a copy elsewhere keeps
    its fingerprint), a tokenizer outside the folder by its file name."""
    folder = spec.onnx_path.parent
    files = {spec.onnx_path.name: spec.onnx_path}
    files |= {_in(folder, path): path for path in spec.signature.external_files}
    if spec.tokenizer_path is not None:
        inside = spec.tokenizer_path.parent == folder
        named = spec.tokenizer_path.name if inside else "tokenizer:" + spec.tokenizer_path.name
        files[named] = spec.tokenizer_path
    return files


def _in(folder: Path, path: Path) -> str:
    """`path` as written under `folder`, not resolved: a symlink's name, not its target's."""
    return Path(os.path.relpath(path, folder)).as_posix()


def answering_config(spec: ModelSpec) -> dict[str, object]:
    """The config's fields that change an answer, as parsed (defaults filled in)."""
    config = spec.config.model_dump(mode="json", exclude=SERVING_ONLY)
    config["batching"] = {k: config["batching"][k] for k in ANSWERING_BATCHING}
    return config
