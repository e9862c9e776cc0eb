"""A served model version's fingerprint: one digest of what makes its answers, so that a user
who keeps answers (vectors in a store) can tell when the model behind a name and version
changed. Read at load from the repository's files, before any copy the server serves from:

- every file of the version's folder (the graph, its external weights, the tokenizer), each
  by its path in the folder and its content's digest (hidden files left out);
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
    folder = spec.onnx_path.parent
    files = {str(p.relative_to(folder)): p for p in answer_files(folder)}
    if spec.tokenizer_path is not None and spec.tokenizer_path.parent != folder:
        files["tokenizer:" + spec.tokenizer_path.name] = spec.tokenizer_path
    content = {
        "files": {name: digests.of(path) for name, path in sorted(files.items())},
        "config": answering_config(spec),
    }
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return PREFIX + hashlib.sha256(canonical.encode()).hexdigest()


def answer_files(folder: Path) -> list[Path]:
    """The version folder's files, hidden ones left out, in a fixed order."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def answering_config(spec: ModelSpec) -> dict[str, object]:
    """The config's fields that change an answer, as parsed (defaults filled in)."""
    config = spec.config.model_dump(mode="json", exclude=SERVING_ONLY)
    config["batching"] = {k: config["batching"][k] for k in ANSWERING_BATCHING}
    return config
