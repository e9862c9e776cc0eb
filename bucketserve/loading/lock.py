"""The repository's lock: the fingerprint (`loading.fingerprint`) of every model version it
serves, written by `bucketserve models lock` to `bucketserve.lock` at the repository's top,
and held to by `serve --locked`: a version whose content no longer matches its line is not
served (at start, or when model control loads it), and the error names the model, the
version and the fix. Unlocked, a version whose content differs from its line is served and
said in a warning with both fingerprints.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from bucketserve.errors import ConfigError

LOCK_FILE = "bucketserve.lock"
FIX = "publish the new content as a new version, or run `bucketserve models lock` again"

Locked = dict[str, dict[int, str]]  # model -> version -> fingerprint


def lock_path(root: Path) -> Path:
    return root / LOCK_FILE


def write_lock(root: Path, fingerprints: Locked) -> Path:
    """`fingerprints` written as the repository's lock (TOML: a table per model)."""
    lines = [
        "# bucketserve models lock: each model version's fingerprint; `serve --locked` serves",
        "# only versions whose content still has it.",
    ]
    for name in sorted(fingerprints):
        lines += ["", f"[{_key(name)}]"]
        lines += [f'{v} = "{f}"' for v, f in sorted(fingerprints[name].items())]
    path = lock_path(root)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def read_lock(root: Path) -> Locked | None:
    """The repository's lock, or None when it has none; ConfigError when it is unreadable."""
    path = lock_path(root)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not a lock file: {exc}") from None
    try:
        return {
            name: {int(v): str(f) for v, f in versions.items()} for name, versions in raw.items()
        }
    except (AttributeError, ValueError):
        raise ConfigError(f"{path}: a table of versions and fingerprints per model") from None


def held_to(lock: Locked | None, name: str, version: int, fingerprint: str) -> str | None:
    """Why version `version` of `name` with this `fingerprint` breaks `lock` (None: it does
    not)."""
    if lock is None:
        return f"the repository has no {LOCK_FILE}: run `bucketserve models lock`"
    locked = lock.get(name, {}).get(version)
    if locked is None:
        return f"model {name} version {version} is not in {LOCK_FILE}: {FIX}"
    if locked != fingerprint:
        return (
            f"model {name} version {version} changed since it was locked ({locked} in "
            f"{LOCK_FILE}, {fingerprint} now): {FIX}"
        )
    return None


def _key(name: str) -> str:
    """A model's name as a TOML table key (quoted: names may hold dots)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
