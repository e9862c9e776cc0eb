"""The memory limit the process runs under, read as a container sets it: cgroup v2's
`memory.max`, v1's `memory.limit_in_bytes` (a v1 "no limit" is none), else the machine's; on
fake cgroup trees laid out as the kernel lays them out."""

from __future__ import annotations

from pathlib import Path

from bucketserve.runtime.memory import container_limit, machine_limit

GIB = 2**30


def tree(root: Path, membership: str, files: dict[str, str]) -> Path:
    """A fake /sys/fs/cgroup under `root` with `files`, and the /proc/self/cgroup naming it."""
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    (root / "self-cgroup").write_text(membership)
    return root / "self-cgroup"


def test_cgroup_v2_memory_max(tmp_path: Path) -> None:
    membership = tree(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        {
            "kubepods/pod1/ctr/memory.max": f"{3 * GIB}\n",
            "kubepods/pod1/ctr/memory.current": f"{GIB // 2}\n",
        },
    )
    limit = container_limit(membership, tmp_path)
    assert limit is not None
    assert (limit.limit, limit.held, limit.room) == (3 * GIB, GIB // 2, 5 * GIB // 2)
    assert limit.source == "cgroup v2 memory.max"


def test_cgroup_v2_without_a_limit_is_none(tmp_path: Path) -> None:
    membership = tree(tmp_path, "0::/\n", {"memory.max": "max\n", "memory.current": "12345\n"})
    assert container_limit(membership, tmp_path) is None


def test_cgroup_v1_memory_limit_in_bytes(tmp_path: Path) -> None:
    """Docker on a v1 host: the memory controller's folder, named in /proc/self/cgroup (or
    its root, inside the container's namespace)."""
    membership = tree(
        tmp_path,
        "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n",
        {
            "memory/docker/abc/memory.limit_in_bytes": f"{2 * GIB}\n",
            "memory/docker/abc/memory.usage_in_bytes": f"{GIB // 4}\n",
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
        },
    )
    limit = container_limit(membership, tmp_path)
    assert limit is not None
    assert (limit.limit, limit.held) == (2 * GIB, GIB // 4)
    assert limit.source == "cgroup v1 memory.limit_in_bytes"


def test_cgroup_v1_no_limit_is_none(tmp_path: Path) -> None:
    membership = tree(
        tmp_path,
        "4:memory:/\n",
        {
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/memory.usage_in_bytes": "1000\n",
        },
    )
    assert container_limit(membership, tmp_path) is None


def test_the_machines_memory_is_read() -> None:
    limit = machine_limit()
    assert limit is not None
    assert 0 < limit.held < limit.limit
