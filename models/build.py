"""Rebuild the bundled models in this folder: `python models/build.py [NAME ...]`.

The same as `bucketserve models build NAME`; with no names it rebuilds the generated tiny
models, whose weights come from fixed seeds, so the files come out byte for byte the same.
"""

import sys
from pathlib import Path

from modelgen.build import build

if __name__ == "__main__":
    for name in sys.argv[1:] or ["tiny-encoder", "tiny-lstm"]:
        print(f"built {name} in {build(name, Path(__file__).resolve().parent)}")
