"""`python -m loadtest.naive MODEL_DIR --port N`: the reference a benchmark row compares with.

What a user writes without an inference server: FastAPI, one ONNX Runtime session with its
default options, and one run per request (no batching), its tokenizer called in the request.
It takes `/predict` bodies with `text` or `sequences` and answers in the same form, so the same
load runs against it. Its endpoint is a plain `def`, so FastAPI runs it in its thread pool and
two requests can be in ONNX Runtime at once. Not part of the served package.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import uvicorn
from fastapi import FastAPI
from tokenizers import Tokenizer


def make_app(model_dir: Path) -> FastAPI:
    config = tomllib.loads((model_dir / "config.toml").read_text())
    version = max((p for p in model_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    session = ort.InferenceSession(str(version / "model.onnx"), providers=["CPUExecutionProvider"])
    tokenizer = None
    if "tokenizer" in config:
        tokenizer = Tokenizer.from_file(str(version / config["tokenizer"]["file"]))
        tokenizer.no_padding()
        tokenizer.enable_truncation(config["tokenizer"].get("max_length", 512))
    roles = {spec.get("role"): name for name, spec in config["inputs"].items()}
    app = FastAPI()

    @app.get("/v2/health/ready")
    def ready() -> dict[str, bool]:
        return {"ready": True}

    @app.post("/predict")
    def predict(body: dict[str, Any]) -> dict[str, Any]:
        if "text" in body:
            assert tokenizer is not None
            sequences = [e.ids for e in tokenizer.encode_batch(body["text"])]
        else:
            sequences = body["sequences"]
        wanted = body.get("outputs") or [o.name for o in session.get_outputs()]
        answers = []
        for ids in sequences:  # one run per sequence: nothing padded, nothing batched
            tokens = np.asarray([ids], dtype=np.int64)
            feeds = {roles["tokens"]: tokens}
            if "mask" in roles:
                feeds[roles["mask"]] = np.ones_like(tokens)
            if "token_types" in roles:
                feeds[roles["token_types"]] = np.zeros_like(tokens)
            outputs = session.run(wanted, feeds)
            answers.append({n: o[0].tolist() for n, o in zip(wanted, outputs, strict=True)})
        return {"model": model_dir.name, "outputs": answers}

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.naive", description=__doc__)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(make_app(args.model_dir), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
