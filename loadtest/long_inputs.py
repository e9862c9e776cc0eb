"""What embedding long documents in windows costs, against the same tokens sent as texts.

minilm served (`bucketserve serve`, a process of its own) with `[tokenizer] long_inputs =
"windows"` (max_length 128, windows overlapping by 16, its per-token states mean-pooled).
`--documents` documents of about `--tokens` tokens each go to `/v1/embeddings` from
`--clients` concurrent clients, one document a request; then the same windows, each decoded
to its text, go as separate texts (one document's windows a request), so that both runs
embed the same tokens. Rounds alternate the two; reported: tokens a second of each, and
their ratio (windows / texts).

    python -m loadtest.long_inputs --documents 32 --tokens 2000 --clients 8 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bucketserve.loading.builder import load_tokenizer
from loadtest.payloads import natural_texts
from loadtest.process import running_server

MAX_LENGTH, OVERLAP = 128, 16


def windowed_repository(minilm: Path, root: Path) -> Path:
    """minilm's entry, served in windows of MAX_LENGTH overlapping by OVERLAP."""
    entry = root / "models" / "minilm"
    shutil.copytree(minilm, entry)
    config = entry / "config.toml"
    text = config.read_text().replace("max_length = 256", f"max_length = {MAX_LENGTH}")
    text = text.replace(
        "[tokenizer]\n", f'[tokenizer]\nlong_inputs = "windows"\nwindow_overlap = {OVERLAP}\n'
    )
    text = text.replace(
        'output = "sentence_embedding"\npooling = "none"',
        'output = "last_hidden_state"\npooling = "mean"',
    )
    config.write_text(text)
    return entry.parent


def window_texts(tokenizer_path: Path, document: str) -> list[str]:
    """The document's windows, each decoded to its text (what a client splitting by hand
    would send)."""
    whole = load_tokenizer(tokenizer_path, MAX_LENGTH)
    room = MAX_LENGTH - whole.num_special_tokens_to_add(False)
    whole.no_truncation()
    encoding = whole.encode(document, add_special_tokens=False)
    encoding.truncate(room, stride=OVERLAP)
    return [whole.decode(run.ids) for run in [encoding, *encoding.overflowing]]


async def rate(client: httpx.AsyncClient, bodies: list[dict[str, Any]], clients: int) -> float:
    """Tokens a second over `bodies`, `clients` at a time."""
    queue = list(bodies)
    tokens = 0

    async def one() -> None:
        nonlocal tokens
        while queue:
            answer = await client.post("/v1/embeddings", json=queue.pop())
            assert answer.status_code == 200, answer.text
            tokens += answer.json()["usage"]["prompt_tokens"]

    began = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(clients)))
    return tokens / (time.perf_counter() - began)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        models = windowed_repository(Path(args.minilm), Path(tmp))
        tokenizer = models / "minilm" / "1" / "tokenizer.json"
        lengths = [args.tokens] * args.documents
        documents = natural_texts(str(tokenizer), lengths, seed=7)
        whole = [{"model": "minilm", "input": d} for d in documents]
        split = [{"model": "minilm", "input": window_texts(tokenizer, d)} for d in documents]
        rounds: dict[str, list[float]] = {"windows": [], "texts": []}
        log = Path(tmp) / "server.log"
        with running_server(models, log_path=log) as (_, url):
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                await rate(client, whole[:2], 2)  # (warm)
                for _ in range(args.rounds):
                    rounds["windows"].append(await rate(client, whole, args.clients))
                    rounds["texts"].append(await rate(client, split, args.clients))
    best = {k: max(v) for k, v in rounds.items()}
    return {
        "tokens_per_s": rounds,
        "best": best,
        "windows_over_texts": round(best["windows"] / best["texts"], 3),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minilm", default="models/minilm")
    parser.add_argument("--documents", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
