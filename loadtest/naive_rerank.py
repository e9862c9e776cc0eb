"""`python -m loadtest.naive_rerank MODEL_DIR --port N [--pad]`: the rerankers a rerank
benchmark row compares with, taking text-embeddings-inference's `/rerank` body.

What a user writes without a server that batches by length: FastAPI, one ONNX Runtime session
with its default options, the model's tokenizer pairing each (query, text) as the server's does.
`--pad` runs a request's pairs as one batch padded to its longest pair (what a server that
batches each request as it came does); without it, one run per pair (nothing padded, nothing
batched). The endpoint is a plain `def`, so FastAPI runs it in its thread pool. Not part of the
served package.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from tokenizers import Tokenizer


def make_app(model_dir: Path, pad: bool) -> FastAPI:
    config = tomllib.loads((model_dir / "config.toml").read_text())
    version = max((p for p in model_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    session = ort.InferenceSession(str(version / "model.onnx"), providers=["CPUExecutionProvider"])
    tokenizer = Tokenizer.from_file(str(version / config["tokenizer"]["file"]))
    tokenizer.no_padding()
    tokenizer.enable_truncation(config["tokenizer"]["max_length"])
    output = config["classifier"]["output"]
    app = FastAPI()

    def run(encodings: list[Any]) -> list[float]:
        longest = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), longest), np.int64)
        types, mask = np.zeros_like(ids), np.zeros_like(ids)
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)], types[row, : len(e.ids)] = e.ids, e.type_ids
            mask[row, : len(e.ids)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        (logits,) = session.run([output], feeds)
        return [float(1 / (1 + np.exp(-x))) for x in logits[:, 0]]

    @app.get("/v2/health/ready")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/rerank")
    def rerank(body: dict[str, Any]) -> list[dict[str, Any]]:
        encodings = tokenizer.encode_batch([(body["query"], t) for t in body["texts"]])
        scores = run(encodings) if pad else [run([e])[0] for e in encodings]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [{"index": i, "score": scores[i]} for i in order]

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pad", action="store_true", help="a request's pairs as one batch")
    args = parser.parse_args(argv)
    app = make_app(args.model_dir, args.pad)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
