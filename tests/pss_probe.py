"""Run in a subprocess by test_weights: Pss growth when every key of a model is bound.

Prints one JSON line: the model files' bytes, Pss after the default key, Pss after all keys,
bound keys, sessions. The weights cache is the environment's (XDG_CACHE_HOME).
"""

from __future__ import annotations

import ctypes
import gc
import json
import sys
from pathlib import Path

from bucketserve.loading import build_model, load_model_spec
from bucketserve.loading.check import random_sequences


def pss_bytes() -> int:
    """Pss once freed heap is given back: what load time freed (the weights cache written, its
    folding session) would otherwise inflate one reading and not the other."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))


def main(model_dir: str, binding: str) -> None:
    spec = load_model_spec(Path(model_dir))
    assert spec is not None
    model = build_model(spec, binding)  # binds and warms the default key
    one_key = pss_bytes()
    for key in model.plan.all_keys():
        model.prepare(key)
        model.run_batch(key, random_sequences(model.info.rules, [key.length]))
    print(
        json.dumps(
            {
                "weight_bytes": sum(f.stat().st_size for f in spec.onnx_path.parent.iterdir()),
                "pss_one_key": one_key,
                "pss_all_keys": pss_bytes(),
                "bound_keys": len(model.executor.bound_keys),
                "sessions": len(model.executor.sessions),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
