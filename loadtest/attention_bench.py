"""What fused attention buys on a CPU: peak memory, time and exactness of one batch at long
lengths (512, 2,048 and 8,192 tokens by default; batch 1, and batch 2 at 2,048), the plain
export against each way ONNX Runtime has of running attention.

Models, made here with random weights (what is measured is cost and exactness, not meaning):

- `bert`: transformers' BertModel (32 wide, 2 heads, 2 layers, 8,192 positions) exported by
  `modelgen.hf_export` as `models import` exports it (transformers' default attention, SDPA);
- `bert-eager`: the same weights with transformers' eager attention, the pattern ONNX Runtime's
  transformer optimizer fuses;
- `modernbert`: ModernBertModel (32 wide, 2 heads, 3 layers, a local window of 128 in two of
  them, 8,192 positions), exported as `models import` exports it;
- `attention`: one self-attention layer (x -> Q, K, V -> attention -> out, 32 wide, 2 heads)
  built with onnx.helper, once in each op ONNX Runtime has for it: plain MatMul / Softmax,
  `com.microsoft.Attention` (a mask index), `com.microsoft.MultiHeadAttention` with a key
  padding mask and without one, the ONNX `Attention` of opset 23 (a bool mask, which it takes
  only as [B, 1, T, T]) and of opset 24 (`nonpad_kv_seqlen`).

Each model's variants: `plain`; `ort-bert`, `ort-bert-mha` (`onnxruntime.transformers.
optimizer.optimize_model`, model_type "bert", its default mask index or MultiHeadAttention);
`fold` (`bucketserve.loading.fusion.fuse_attention`: MultiHeadAttention's flash path, the
padding mask folded into the keys). What each fusion fired is reported with the figures.

Every (variant, rows, length) runs in a process of its own, so that no run inherits another's
heap: a session on one thread with the CPU arena off, one warm-up run of 8 tokens, then
/proc/self/clear_refs reset (VmHWM) and two runs. Peak: VmHWM less VmRSS before them; time: the
faster run. Every batch is padded through its mask, as the server pads within a bucket (batch
1: its last eighth; batch 2: the second row a quarter short). Difference: the largest |variant
- plain| / (1 + |plain|) over the tokens the mask keeps.

    python -m loadtest.attention_bench --lengths 512 2048 8192 --out attention.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH, HEADS, VOCAB, POSITIONS = 32, 2, 200, 8192
Built = tuple[Path, dict[str, Any]]  # a variant's graph, and what its fusion fired


@dataclass(frozen=True)
class Variant:
    model: str
    name: str
    path: Path
    fired: dict[str, Any]


# -- the models ---------------------------------------------------------------------------------


def export_bert(path: Path, attention: str) -> Path:
    """BertModel, seeded, exported as `models import` exports a folder (`attention`: "sdpa",
    transformers' default, or "eager")."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        max_position_embeddings=POSITIONS,
    )
    config._attn_implementation = attention
    model = BertModel(config, add_pooling_layer=False)
    return _export(model, path, ("input_ids", "attention_mask", "token_type_ids"))


def export_modernbert(path: Path) -> Path:
    """ModernBertModel, seeded, as `modelgen.long_context` makes it: a global layer, then two
    with a local window of 128."""
    import torch
    from transformers import ModernBertModel

    from modelgen.long_context import modernbert_config

    torch.manual_seed(0)
    config = modernbert_config(VOCAB)
    return _export(ModernBertModel(config), path, ("input_ids", "attention_mask"))


def _export(model: Any, path: Path, inputs: tuple[str, ...]) -> Path:
    """`model`'s per-token states exported by `modelgen.hf_export`, as `modelgen.hf_folder`
    exports a folder's model."""
    import torch

    from modelgen.hf_export import AXES, export_text_model

    class Named(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: torch.Tensor) -> Any:
            return self.model(**dict(zip(inputs, tensors, strict=True))).last_hidden_state

    path.parent.mkdir(parents=True, exist_ok=True)
    export_text_model(Named().eval(), path, {"last_hidden_state": AXES}, VOCAB, inputs)
    return path


def attention_layer(path: Path, kind: str) -> Path:
    """One self-attention layer, x [B, T, 32] and attention_mask [B, T] -> [B, T, 32], its
    attention run by `kind`'s op; the same seeded weights in every kind."""
    size = WIDTH // HEADS
    rng = np.random.default_rng(0)
    w = {n: (rng.standard_normal((WIDTH, WIDTH)) / math.sqrt(WIDTH)).astype(np.float32)
         for n in "qkvo"}  # fmt: skip
    nodes: list[onnx.NodeProto] = []
    weights = [numpy_helper.from_array(w["o"], "w_o")]
    opsets = {"": 17}

    def const(name: str, value: Any) -> str:
        weights.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(kind: str, inputs: list[str], out: str, domain: str = "", **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [out], domain=domain, **attrs))
        return out

    def lengths(to: int) -> str:
        total = op("ReduceSum", ["attention_mask", const("time", np.array([1], np.int64))], "n",
                   keepdims=0)  # fmt: skip
        return op("Cast", [total], "lengths", to=to)

    if kind == "ms-attention":  # (packed Q, K, V weights; the mask as each row's length)
        opsets["com.microsoft"] = 1
        packed = const("w_qkv", np.concatenate([w["q"], w["k"], w["v"]], axis=1))
        bias = const("b_qkv", np.zeros(3 * WIDTH, np.float32))
        y = op("Attention", ["x", packed, bias, lengths(TensorProto.INT32)], "y",
               domain="com.microsoft", num_heads=HEADS)  # fmt: skip
    else:
        q, k, v = (op("MatMul", ["x", const(f"w_{n}", w[n])], n) for n in "qkv")
    if kind == "plain":
        split = const("split", np.array([0, 0, HEADS, size], np.int64))
        qh, kh, vh = (
            op("Transpose", [op("Reshape", [t, split], f"{t}_r")], f"{t}_h", perm=[0, 2, 1, 3])
            for t in (q, k, v)
        )
        kt = op("Transpose", [kh], "kt", perm=[0, 1, 3, 2])
        root = const("root", np.float32(math.sqrt(size)))
        scores = op("Div", [op("MatMul", [qh, kt], "qk"), root], "scores")
        keep = op("Cast", ["attention_mask"], "keep", to=TensorProto.FLOAT)
        off = op("Sub", [const("one", np.float32(1)), keep], "off")
        bias = op("Mul", [off, const("big", np.float32(-1e9))], "bias2")
        bias = op("Unsqueeze", [bias, const("axes", np.array([1, 2], np.int64))], "bias4")
        weights_ = op("Softmax", [op("Add", [scores, bias], "masked")], "p", axis=-1)
        context = op("Transpose", [op("MatMul", [weights_, vh], "ctx")], "ctx_t", perm=[0, 2, 1, 3])
        y = op("Reshape", [context, const("merge", np.array([0, 0, WIDTH], np.int64))], "y")
    elif kind in ("ms-mha-mask", "ms-mha"):
        opsets["com.microsoft"] = 1
        given = [q, k, v]
        if kind == "ms-mha-mask":
            given += ["", op("Cast", ["attention_mask"], "key_padding", to=TensorProto.INT32)]
        y = op("MultiHeadAttention", given, "y", domain="com.microsoft", num_heads=HEADS)
    elif kind == "onnx-23":  # (its CPU kernel takes a mask only with the query axis: [B,1,T,T])
        opsets[""] = 23
        axes = const("axes", np.array([1, 2], np.int64))
        keep = op("Unsqueeze", ["attention_mask", axes], "keep4")
        keep = op("Cast", [keep], "keep_bool", to=TensorProto.BOOL)
        shape = op("Shape", ["x"], "x_shape")
        b = op(
            "Slice",
            [shape, const("z", np.array([0], np.int64)), const("o", np.array([1], np.int64))],
            "b",
        )
        t = op("Slice", [shape, "o", const("two", np.array([2], np.int64))], "t")
        square = op("Concat", [b, "o", t, t], "square", axis=0)
        y = op("Attention", [q, k, v, op("Expand", [keep, square], "mask")], "y",
               q_num_heads=HEADS, kv_num_heads=HEADS)  # fmt: skip
    elif kind == "onnx-24":  # (each row's keys past its length masked: no mask tensor)
        opsets[""] = 24
        y = op("Attention", [q, k, v, "", "", "", lengths(TensorProto.INT64)], "y",
               q_num_heads=HEADS, kv_num_heads=HEADS)  # fmt: skip
    op("MatMul", [y, "w_o"], "out")
    graph = helper.make_graph(
        nodes, f"attention_{kind}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "time", WIDTH]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "time"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "time", WIDTH])],
        weights,
    )  # fmt: skip
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()]
    )
    model.ir_version = 10
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


# -- the fusions --------------------------------------------------------------------------------


def ort_optimized(plain: Path, out: Path, mha: bool) -> Built:
    """ONNX Runtime's transformer optimizer for BERT (its own fusions only: opt_level 0, the
    session's optimizer does the rest); `mha`: MultiHeadAttention instead of Attention."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.use_multi_head_attention = mha
    logging.disable(logging.WARNING)  # (its notes on each pattern it does not find)
    try:
        optimized = optimize_model(
            str(plain), model_type="bert", num_heads=HEADS, hidden_size=WIDTH, opt_level=0,
            optimization_options=options,
        )  # fmt: skip
    finally:
        logging.disable(logging.NOTSET)
    optimized.save_model_to_file(str(out))
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    return out, {"fused": fused, "attention_ops": _attention_ops(out)}


def every_model_type(plain: Path, out: Path) -> dict[str, Any]:
    """The attention ops each of the optimizer's model types leaves in `plain` (or why it
    failed), "bert_tf"-like ones aside: which, if any, fuses this export's attention."""
    from onnxruntime.transformers.optimizer import MODEL_TYPES, optimize_model

    found: dict[str, Any] = {}
    logging.disable(logging.WARNING)
    try:
        for model_type in MODEL_TYPES:
            if model_type.endswith(("_tf", "_keras")):
                continue
            try:
                optimized = optimize_model(
                    str(plain), model_type=model_type, num_heads=HEADS, hidden_size=WIDTH,
                    opt_level=0,
                )  # fmt: skip
                optimized.save_model_to_file(str(out))
                found[model_type] = _attention_ops(out)
            except Exception as exc:  # (its own: a model type that cannot read this graph)
                found[model_type] = f"failed: {type(exc).__name__}: {exc}"[:200]
    finally:
        logging.disable(logging.NOTSET)
    return found


def folded(plain: Path, out: Path) -> Built:
    """bucketserve's fold (`fuse_attention`): plain's copy when it fused and checked."""
    from bucketserve.loading.fusion import fuse_attention

    report = fuse_attention(plain, out)
    if report is None:
        return plain, {"fused": 0, "note": "nothing fused (or not exact): the plain graph"}
    return out, {
        "fused": report.fused, "left": list(report.left),
        "check_difference": report.largest_difference, "attention_ops": _attention_ops(out),
    }  # fmt: skip


def _attention_ops(path: Path) -> dict[str, int]:
    graph = onnx.load(str(path), load_external_data=False).graph
    ops: dict[str, int] = {}
    for node in graph.node:
        if "Attention" in node.op_type or node.op_type == "Softmax":
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


def variants(root: Path, models: list[str]) -> list[Variant]:
    """Every model's graphs, plain first."""
    made: list[Variant] = []

    def add(model: str, name: str, built: Built) -> None:
        made.append(Variant(model, name, *built))

    if "attention" in models:
        for kind in ("plain", "ms-attention", "ms-mha-mask", "ms-mha", "onnx-23", "onnx-24"):
            add("attention", kind, (attention_layer(root / "attention" / f"{kind}.onnx", kind), {}))
        add(
            "attention",
            "fold",
            folded(root / "attention" / "plain.onnx", root / "attention" / "fold.onnx"),
        )
    for model, make in (
        ("bert", lambda p: export_bert(p, "sdpa")),
        ("bert-eager", lambda p: export_bert(p, "eager")),
        ("modernbert", export_modernbert),
    ):
        if model not in models:
            continue
        plain = make(root / model / "plain.onnx")
        sweep = every_model_type(plain, root / model / "swept.onnx")
        add(model, "plain", (plain, {"attention_ops_by_model_type": sweep}))
        add(model, "ort-bert", ort_optimized(plain, root / model / "ort-bert.onnx", mha=False))
        if model == "bert-eager":
            add(
                model,
                "ort-bert-mha",
                ort_optimized(plain, root / model / "ort-bert-mha.onnx", mha=True),
            )
        add(model, "fold", folded(plain, root / model / "fold.onnx"))
    return made


# -- one run, in a process of its own ---------------------------------------------------------


def feeds(names: list[str], rows: int, length: int) -> dict[str, np.ndarray]:
    """The batch every variant gets at (rows, length): seeded ids (or features) and a padding
    mask (batch 1: its last eighth; more rows: the second a quarter short)."""
    rng = np.random.default_rng(rows * 100_003 + length)
    mask = np.ones((rows, length), np.int64)
    if rows == 1:
        mask[0, length - length // 8 :] = 0
    else:
        mask[1, length - length // 4 :] = 0
    given: dict[str, np.ndarray] = {
        "input_ids": rng.integers(5, VOCAB, (rows, length)),
        "attention_mask": mask,
        "token_type_ids": np.zeros((rows, length), np.int64),
        "x": rng.standard_normal((rows, length, WIDTH)).astype(np.float32),
    }
    return {name: given[name] for name in names}


def status(field: str) -> int:
    """A /proc/self/status field, in bytes."""
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def worker(path: Path, rows: int, length: int, out: Path) -> dict[str, float]:
    """One session's peak memory growth and time over a run of (rows, length)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    session.run(None, feeds(names, 1, 8))
    batch = feeds(names, rows, length)
    with open("/proc/self/clear_refs", "w") as clear:  # (VmHWM from here)
        clear.write("5")
    before = status("VmRSS")
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        answer = session.run(None, batch)[0]
        seconds.append(time.perf_counter() - start)
    np.save(out, answer)
    return {"peak_mib": (status("VmHWM") - before) / 2**20, "seconds": min(seconds)}


def measure(variant: Variant, rows: int, length: int, out: Path, timeout: float) -> dict[str, Any]:
    """`worker` in a process of its own; its error, if it failed."""
    command = [sys.executable, "-m", "loadtest.attention_bench", "--worker", str(variant.path),
               str(rows), str(length), str(out)]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if done.returncode != 0:
        return {
            "error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:300]
        }
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def difference(plain: np.ndarray, fused: np.ndarray, mask: np.ndarray) -> float:
    """The largest |fused - plain| / (1 + |plain|) over the tokens `mask` keeps."""
    keep = mask.astype(bool)
    apart = np.abs(fused[keep].astype(np.float64) - plain[keep]) / (1 + np.abs(plain[keep]))
    return float(np.nan_to_num(apart, nan=np.inf).max())


# -- the report -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.attention_bench", description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--padded", type=int, default=2048, help="the length of the batch of 2")
    parser.add_argument(
        "--models", nargs="+", default=["attention", "bert", "bert-eager", "modernbert"]
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds, a run")
    parser.add_argument("--out", type=Path, help="JSON")
    parser.add_argument("--worker", nargs=4, metavar=("GRAPH", "ROWS", "LENGTH", "NPY"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.worker:
        graph, rows, length, out = args.worker
        print(json.dumps(worker(Path(graph), int(rows), int(length), Path(out))))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    shapes = [(1, n) for n in args.lengths] + ([(2, args.padded)] if args.padded else [])
    import onnxruntime

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        made = variants(root / "models", args.models)
        for variant in made:
            print(f"{variant.model} {variant.name}: {json.dumps(variant.fired)}", flush=True)
        for rows, length in shapes:
            plain: dict[str, np.ndarray] = {}
            for variant in made:
                out = root / "out" / f"{variant.model}-{variant.name}-{rows}x{length}.npy"
                out.parent.mkdir(exist_ok=True)
                row: dict[str, Any] = {"model": variant.model, "variant": variant.name,
                                       "rows": rows, "length": length}  # fmt: skip
                row |= measure(variant, rows, length, out, args.timeout)
                if "error" not in row:
                    answer = np.load(out)
                    if variant.name == "plain":
                        plain[variant.model] = answer
                    elif variant.model in plain:
                        mask = feeds(["attention_mask"], rows, length)["attention_mask"]
                        row["max_difference"] = difference(plain[variant.model], answer, mask)
                    out.unlink()
                results.append(row)
                print(_line(row), flush=True)
        fired = {f"{v.model}/{v.name}": v.fired for v in made if v.fired}
    print()
    print(table(results))
    if args.out:
        machine = {
            "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
        }
        args.out.write_text(
            json.dumps({"machine": machine, "fired": fired, "runs": results}, indent=1)
        )
    return 0


def _line(row: dict[str, Any]) -> str:
    shape = f"{row['rows']} x {row['length']}"
    if "error" in row:
        return f"{row['model']:<11} {row['variant']:<13} {shape:>9}  failed: {row['error']}"
    apart = f"{row['max_difference']:.1e}" if "max_difference" in row else "-"
    return (f"{row['model']:<11} {row['variant']:<13} {shape:>9}  {row['peak_mib']:8.1f} MiB "
            f"{row['seconds']:8.3f} s  {apart}")  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: a row a (model, variant), a column a shape: peak MiB / seconds / difference."""
    shapes = list(dict.fromkeys((r["rows"], r["length"]) for r in results))
    keys = list(dict.fromkeys((r["model"], r["variant"]) for r in results))
    cell = {(r["model"], r["variant"], r["rows"], r["length"]): r for r in results}
    head = " | ".join(f"{rows} x {length:,}" for rows, length in shapes)
    lines = [f"| model | variant | {head} |", "| --- | --- |" + " --- |" * len(shapes)]
    for model, name in keys:
        cells = []
        for rows, length in shapes:
            r = cell.get((model, name, rows, length))
            if r is None or "error" in r:
                cells.append("failed" if r else "")
                continue
            apart = f" / {r['max_difference']:.0e}" if "max_difference" in r else ""
            cells.append(f"{r['peak_mib']:,.0f} MiB / {r['seconds']:.3f} s{apart}")
        lines.append(f"| {model} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
