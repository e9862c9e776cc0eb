"""What one large sparse-embedding request costs the server: memory, the event loop, time.

A SPLADE-shaped model at a real model's size (MiniLM-L6's encoder, the weights `bucketserve
models build minilm` uses, under BERT's masked-LM head with seeded weights, its bias lowered
to a trained SPLADE's sparsity: logits over the 30,522 entries of its vocabulary at every
token), exported as optimum writes one and brought in with `models import`. One request of
`--texts` texts of about `--tokens` tokens each goes to `/embed_sparse` while another client
asks for liveness every 10 ms. Reported: the
server's Pss growth at its peak, the slowest health answer meanwhile (the event loop's
longest stall, as a client sees it) and the request's time; then the same for a large body of
short strings the server refuses (`/embed_sparse` and `/v1/embeddings`, an 8 MiB body; one,
then six at once).

    python -m loadtest.sparse_memory --texts 256 --tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bucketserve.loading.importer import import_model
from loadtest.costly_bodies import filled, measure
from loadtest.payloads import natural_texts
from loadtest.process import running_server
from modelgen.hf_export import export_text_model
from modelgen.minilm import _model_source

# Subtracted from the head's bias: with seeded weights about half the vocabulary would get a
# weight in every passage, where a trained SPLADE gives a few hundred terms (measured here:
# 170-270 of 30,522 at 4.5 for passages of 128 tokens; 22,000 with the bias as seeded).
SPARSE_BIAS = 4.5


def write_splade(folder: Path) -> Path:
    """MiniLM-L6 under a masked-LM head, exported as optimum writes a fill-mask model; the
    tokenizer file is returned."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForMaskedLM

    source = _model_source()
    torch.manual_seed(0)
    model = AutoModelForMaskedLM.from_pretrained(
        source, local_files_only=True, attn_implementation="eager"
    ).eval()
    with torch.no_grad():  # a trained SPLADE's sparsity: a few hundred terms a passage
        model.cls.predictions.bias -= SPARSE_BIAS
    folder.mkdir(parents=True)
    logits = {"logits": {0: "batch_size", 1: "sequence_length"}}
    export_text_model(model, folder / "model.onnx", logits, model.config.vocab_size)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    return folder / "tokenizer.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.sparse_memory", description=__doc__)
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=8 * 2**20, help="--max-body-bytes")
    parser.add_argument("--flags", default="", help="more `serve` flags, space-separated")
    args = parser.parse_args(argv)
    rows: list[tuple[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tokenizer = write_splade(root / "export")
        import_model(root / "export", root / "models", "splade")
        texts = natural_texts(str(tokenizer), [args.tokens] * args.texts)
        body = orjson.dumps({"inputs": texts})
        flags = ("--max-body-bytes", str(args.limit), "--log-level", "warning", *args.flags.split())
        with running_server(root / "models", *flags, log_path=root / "log") as (process, url):
            measure(url, process.pid, "/embed_sparse", orjson.dumps({"inputs": texts[:4]}))
            answered = measure(url, process.pid, "/embed_sparse", body)
            rows.append((f"/embed_sparse, {args.texts} texts", answered))
            for path, shape in (
                ("/embed_sparse", lambda n: {"inputs": ["a"] * n}),
                ("/v1/embeddings", lambda n: {"model": "splade", "input": ["a"] * n}),
            ):
                refused = filled(shape, args.limit - 256)
                rows.append((f"{path}, short strings", measure(url, process.pid, path, refused)))
                six = measure(url, process.pid, path, refused, copies=6)
                rows.append((f"{path}, short strings, six at once", six))
    print(
        "| request | body MiB | status | time s | Pss growth MiB | slowest health answer ms |\n"
        "| --- | --- | --- | --- | --- | --- |"
    )
    for name, row in rows:
        print(
            f"| {name} | {row['mib']:.2f} | {row['status']} | {row['seconds']:.2f} | "
            f"{row['pss_growth_mib']:.0f} | {row['worst_health_ms']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
