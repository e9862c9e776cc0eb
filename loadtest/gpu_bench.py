"""`python -m loadtest.gpu_bench`: the engine on ONNX Runtime's CUDA provider, measured.

Run on a machine with a GPU and onnxruntime-gpu. The model is MiniLM-L6's shape (6 layers,
384 wide, 12 heads, a 30,522-entry vocabulary; seeded weights from `modelgen.graphs`, since
what is measured here is cost and exactness, not meaning), served with texts' natural
lengths (lognormal, median 22 tokens, 99th percentile 167, up to 256). Reported:

- per binding (`shared-session`, `session-per-key`: a static-shape session per key, and
  `mutable`), on CUDA (the server's provider options: TF32 off; and `shared-session` again
  with TF32 on, as ONNX Runtime's default has it): the load-time check's verdict on the GPU
  (padding, batching, policy), the load time, and sequences per second over 4,000 sequences
  batched by the plan's keys; every answer of 64 of them against the model alone on the GPU
  and on the CPU;
- per key, ONNX Runtime alone with I/O bound on the GPU: a dynamic session, a static-shape
  session, and a static-shape session replaying a CUDA graph (`enable_cuda_graph`), ms a
  batch;
- the same traffic on the machine's CPU cores, for scale.

Writes JSON to `--out` and prints a summary.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CONFIG = """
mode = "bucketing"
binding = "shared-session"
providers = {providers}

[inputs.input_ids]
role = "tokens"
vocab_size = 30522
pad_value = 0

[inputs.attention_mask]
role = "mask"
pad_value = 0

[inputs.token_type_ids]
role = "token_types"

[outputs.last_hidden_state]
per_step = true

[outputs.sentence_embedding]
per_step = false

[batching]
buckets = [16, 24, 32, 48, 64, 96, 128, 192, 256]
max_batch_size = 64
max_batch_tokens = 16384
"""
KEYS = [(64, 32), (64, 64), (32, 128), (16, 256)]  # (rows, length) for the graph experiment


def natural_lengths(count: int, seed: int = 0) -> list[int]:
    """Token counts of texts: lognormal, median 22, 99th percentile 167, 4 to 256."""
    rng = np.random.default_rng(seed)
    drawn = np.clip(np.round(rng.lognormal(np.log(22), 0.873, count)), 4, 256)
    return [int(n) for n in drawn]


def write_repository(root: Path, providers: list[str], options: str = "") -> Path:
    """The model's repository entry; `options`: lines of its CUDA provider's options."""
    from modelgen.graphs import encoder
    from modelgen.save import save_model

    graph = encoder(vocab=30522, dim=384, heads=12, layers=6, ffn=1536, max_positions=512, seed=3)
    save_model(graph, root / "minilm-shaped" / "1" / "model.onnx")
    config = CONFIG.format(providers=json.dumps(providers))
    if options:
        config += f"\n[provider_options.CUDAExecutionProvider]\n{options}\n"
    (root / "minilm-shaped" / "config.toml").write_text(config)
    return root / "minilm-shaped"


def attempt(report: dict[str, Any], name: str, run: Callable[[], Any]) -> None:
    """`run()`'s result under `name`, or the error it raised (the rest still runs)."""
    began = time.perf_counter()
    try:
        report[name] = run()
    except Exception:
        report[name] = {"error": traceback.format_exc(limit=4)}
    shown = json.dumps(report[name], default=lambda o: type(o).__name__)
    print(f"[{time.perf_counter() - began:6.1f} s] {name}: {shown[:400]}", flush=True)


def engine_runs(folder: Path, binding: str, sequences: list[np.ndarray]) -> dict[str, Any]:
    """Load under `binding`, bind every key, then run the sequences batched by the plan."""
    from bucketserve.loading import build_model, load_model_spec

    spec = load_model_spec(folder)
    assert spec is not None
    began = time.perf_counter()
    model = build_model(spec, binding)
    loaded = time.perf_counter() - began
    for key in model.plan.all_keys():
        model.prepare(key)
    lengths = [len(s) for s in sequences]
    batches = list(model.plan.batches(lengths))
    for key, indices in batches[:8]:  # (warm: the first runs of a key allocate)
        model.run_batch(key, [sequences[i] for i in indices])
    began = time.perf_counter()
    for key, indices in batches:
        model.run_batch(key, [sequences[i] for i in indices])
    seconds = time.perf_counter() - began
    check = model.info.served_config["check"]
    return {
        "providers": model.executor.providers,
        "policy": model.plan.policy.value,
        "check_padding": check["padding"],
        "check_batching": check["batching"],
        "load_s": round(loaded, 2),
        "sequences_per_s": round(len(sequences) / seconds, 1),
        "tokens_per_s": round(sum(lengths) / seconds),
        "batches": len(batches),
        "model": model,
    }


def exactness(model: Any, alone: dict[str, Any], sequences: list[np.ndarray]) -> dict[str, float]:
    """The served batches' answers against the model alone (batch 1, unpadded) on each of
    `alone`'s sessions (the GPU's, the CPU's): the largest absolute difference."""
    names = ["last_hidden_state", "sentence_embedding"]
    worst = dict.fromkeys(alone, 0.0)
    lengths = [len(s) for s in sequences]
    for key, indices in model.plan.batches(lengths):
        batch = model.run_batch(key, [sequences[i] for i in indices])
        for i, served in zip(indices, batch, strict=True):
            feeds = model.info.layout.collate([sequences[i]], 1, lengths[i])
            for where, session in alone.items():
                own = dict(zip(names, session.run(names, feeds), strict=True))
                for name in names:
                    gap = np.abs(np.asarray(served[name]) - own[name][0]).max()
                    worst[where] = max(worst[where], float(gap))
    return {f"max_abs_vs_{where}_alone": value for where, value in worst.items()}


def graph_experiment(onnx_path: Path) -> dict[str, Any]:
    """ms a batch at each of KEYS: dynamic, static-shape, and static-shape with a CUDA graph,
    inputs and outputs bound on the GPU."""
    import onnxruntime as ort

    from bucketserve.runtime.sessions import own_pools_allowed

    results: dict[str, Any] = {}
    for rows, length in KEYS:
        row: dict[str, Any] = {}
        for mode in ("dynamic", "static", "cuda-graph"):
            try:
                options = ort.SessionOptions()
                options.log_severity_level = 3
                options.use_per_session_threads = own_pools_allowed()
                if mode != "dynamic":
                    options.add_free_dimension_override_by_name("batch", rows)
                    options.add_free_dimension_override_by_name("seq", length)
                cuda = {"use_tf32": "0"} | (
                    {"enable_cuda_graph": "1"} if mode == "cuda-graph" else {}
                )
                session = ort.InferenceSession(
                    str(onnx_path), options, providers=[("CUDAExecutionProvider", cuda)]
                )
                rng = np.random.default_rng(0)
                feeds = {
                    "input_ids": rng.integers(1, 30522, (rows, length)).astype(np.int64),
                    "attention_mask": np.ones((rows, length), np.int64),
                    "token_type_ids": np.zeros((rows, length), np.int64),
                }
                binding = session.io_binding()
                for name, value in feeds.items():
                    binding.bind_ortvalue_input(
                        name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0)
                    )
                for out, shape in (
                    ("last_hidden_state", (rows, length, 384)),
                    ("sentence_embedding", (rows, 384)),
                ):
                    value = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cuda", 0)
                    binding.bind_ortvalue_output(out, value)
                for _ in range(5):
                    session.run_with_iobinding(binding)
                times = []
                for _ in range(40):
                    began = time.perf_counter()
                    session.run_with_iobinding(binding)
                    times.append(time.perf_counter() - began)
                row[mode] = round(1000 * statistics.median(times), 3)
            except Exception as exc:
                row[mode] = f"failed: {type(exc).__name__}: {str(exc)[:200]}"
        results[f"{rows}x{length}"] = row
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.gpu_bench", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sequences", type=int, default=4000)
    args = parser.parse_args(argv)
    with contextlib.suppress(ImportError):  # CUDA's libraries as torch's wheels bring them,
        import torch  # noqa: F401  # loaded for ONNX Runtime's CUDA provider
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        with contextlib.suppress(Exception):
            ort.preload_dlls()  # (CUDA and cuDNN from the nvidia-* packages beside it)
    report: dict[str, Any] = {
        "onnxruntime": ort.__version__,
        "available": ort.get_available_providers(),
    }
    from bucketserve.core.model import SequenceRules
    from bucketserve.loading.check import random_sequences
    from bucketserve.runtime.sessions import GraphFile, own_pools_allowed, side_session

    rules = SequenceRules(np.dtype(np.int64), 256, vocab_size=30522)
    lengths = natural_lengths(args.sequences)
    sequences = random_sequences(rules, lengths, seed=1)
    report["traffic"] = {
        "sequences": len(lengths),
        "tokens": sum(lengths),
        "median": int(np.median(lengths)),
    }
    with tempfile.TemporaryDirectory() as scratch:
        gpu_folder = write_repository(
            Path(scratch) / "gpu", ["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
        graph = gpu_folder / "1" / "model.onnx"
        options = ort.SessionOptions()
        options.use_per_session_threads = own_pools_allowed()
        fp32 = ("CUDAExecutionProvider", {"use_tf32": "0"})
        alone = {
            "cpu": side_session(GraphFile(graph, ("CPUExecutionProvider",))),
            "gpu": ort.InferenceSession(str(graph), options, providers=[fp32]),
        }
        tf32_folder = write_repository(
            Path(scratch) / "tf32",
            ["CUDAExecutionProvider", "CPUExecutionProvider"],
            "use_tf32 = 1",
        )
        runs = [(b, gpu_folder, "") for b in ("shared-session", "session-per-key", "mutable")]
        for binding, folder, variant in [*runs, ("shared-session", tf32_folder, ", tf32 on")]:
            name = f"cuda {binding}{variant}"
            attempt(report, name, functools.partial(engine_runs, folder, binding, sequences))
            model = report[name].pop("model", None) if isinstance(report[name], dict) else None
            if model is not None:
                attempt(
                    report,
                    f"{name} exactness",
                    functools.partial(exactness, model, alone, sequences[:64]),
                )
            del model
        attempt(
            report,
            "cuda graphs, ms a batch",
            lambda: graph_experiment(gpu_folder / "1" / "model.onnx"),
        )
        cpu_folder = write_repository(Path(scratch) / "cpu", ["CPUExecutionProvider"])
        attempt(
            report,
            "cpu shared-session",
            lambda: {
                k: v
                for k, v in engine_runs(cpu_folder, "shared-session", sequences[:1000]).items()
                if k != "model"
            },
        )
    args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
