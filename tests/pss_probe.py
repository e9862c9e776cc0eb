"""Run in a subprocess by test_weights: memory growth when every key of a model is bound.

Prints one JSON line: the model files' bytes, the process's private memory after the default
key and after all keys, bound keys, sessions. The weights cache is the environment's
(XDG_CACHE_HOME).

Private memory (Private_Clean + Private_Dirty: Pss less the share of pages that other
processes map too) is what a key costs this process alone. Pss itself moves with every other
process that maps the same libraries (ONNX Runtime's, numpy's): on a machine running other
servers, two readings of one process differed by more than a key's cost.
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from pathlib import Path

from bucketserve.loading import build_model, load_model_spec
from bucketserve.loading.check import random_sequences


def private_bytes() -> int:
    """Private memory once freed heap is given back: what load time freed (the weights cache
    written, its folding session) would otherwise inflate one reading and not the other. The
    weights' memory map is this process's alone (its cache is the test's), so it counts."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return sum(int(fields[k].split()[0]) * 1024 for k in ("Private_Clean", "Private_Dirty"))


def main(model_dir: str, binding: str) -> None:
    spec = load_model_spec(Path(model_dir))
    assert spec is not None
    model = build_model(spec, binding)  # binds and warms the default key
    one_key = private_bytes()
    for key in model.plan.all_keys():
        model.prepare(key)
        model.run_batch(key, random_sequences(model.info.rules, [key.length]))
    print(
        json.dumps(
            {
                "weight_bytes": sum(f.stat().st_size for f in spec.onnx_path.parent.iterdir()),
                "private_one_key": one_key,
                "private_all_keys": private_bytes(),
                "bound_keys": len(model.executor.bound_keys),
                "sessions": len(model.executor.sessions),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
