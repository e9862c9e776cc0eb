"""`python -m deploy.image.smoke`: the image's build and start steps without a Docker engine.

Reads the Dockerfile and does what an image build and `docker run` would do, on this machine:

1. copies the build context (the files .dockerignore lets through) to a scratch folder;
2. runs the build stage's script (deploy/image/build.sh: export extra, minilm export, wheel)
   and the runtime stage's install script (deploy/image/install.sh: the wheel and its runtime
   dependencies only, with the CPU-only onnxruntime), each in a fresh virtual environment,
   with the stages' ENV;
3. starts the server stage's CMD with its ENV (WORKDIR /app is the scratch folder), waits on
   its HEALTHCHECK command, sends real requests over HTTP and gRPC, then stops it with the
   STOPSIGNAL and expects a clean exit.

Two things differ from a real build, on purpose: the server listens on 127.0.0.1 on free ports
(never 0.0.0.0 on a shared machine), and TORCH_INDEX is left unset, since this machine's own
package index already serves CPU torch.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
WORKDIR = "/app"


@dataclass
class Stage:
    name: str
    base: str
    env: dict[str, str] = field(default_factory=dict)
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def last(self, instruction: str) -> str | None:
        values = [v for i, v in self.instructions if i == instruction]
        return values[-1] if values else None


def read_dockerfile(path: Path = ROOT / "Dockerfile") -> dict[str, Stage]:
    """The Dockerfile's stages by name, in order; each with its own instructions and ENV."""
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for item in DockerfileParser(str(path)).structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            base, _, name = value.partition(" AS ")
            stage = stages[name.strip()] = Stage(name.strip(), base.strip())
        elif stage is not None and instruction != "COMMENT":
            stage.instructions.append((instruction, value))
            if instruction == "ENV":
                for pair in shlex.split(value):
                    key, _, raw = pair.partition("=")
                    stage.env[key] = raw
    return stages


def env_of(stages: dict[str, Stage], name: str) -> dict[str, str]:
    """A stage's ENV including what it inherits from the stages it is built FROM."""
    stage = stages[name]
    inherited = env_of(stages, stage.base) if stage.base in stages else {}
    return {**inherited, **stage.env}


def exec_form(value: str) -> list[str]:
    command: list[str] = json.loads(value)
    return command


def healthcheck_command(value: str) -> list[str]:
    """The command of `HEALTHCHECK [options] CMD [...]`."""
    return exec_form(value.split(" CMD ", 1)[1].strip())


def dockerignore_rules() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def in_context(relative: str, rules: list[str]) -> bool:
    """Whether .dockerignore lets a path through: the last matching rule wins, and a rule on a
    folder covers what is inside it."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for rule in rules:
        pattern = rule.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes):
            included = rule.startswith("!")
    return included


def copy_context(target: Path) -> None:
    rules = dockerignore_rules()
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).as_posix()
        prefix = "" if rel == "." else rel + "/"
        # Descend only where something may be let through (never into .git or .venv).
        dirs[:] = [
            d
            for d in dirs
            if in_context(prefix + d, rules)
            or any(r.lstrip("!").startswith(prefix + d + "/") for r in rules if r.startswith("!"))
        ]
        for name in files:
            if in_context(prefix + name, rules):
                (target / prefix).mkdir(parents=True, exist_ok=True)
                shutil.copy2(Path(folder) / name, target / prefix / name)


def run_scripts(stages: dict[str, Stage], context: Path) -> None:
    """Each stage's `RUN sh deploy/image/...` line, as written, in the context folder."""
    for name in ("build", "runtime"):
        env = {**os.environ, **env_of(stages, name), "VARIANT": "cpu"}
        env.pop("TORCH_INDEX", None)
        env["PATH"] = os.environ["PATH"]
        for instruction, value in stages[name].instructions:
            if instruction == "RUN" and value.startswith("sh deploy/image/"):
                command = value.replace("/opt/", str(context) + "/opt/")
                print(f"[{name}] {command}", file=sys.stderr, flush=True)
                subprocess.run(["sh", "-c", command], cwd=context, env=env, check=True)


def check_runtime_venv(venv: Path) -> None:
    """The CPU image's environment holds the CPU-only onnxruntime, never onnxruntime-gpu, and
    nothing of the build stage (torch, transformers)."""
    probe = (
        "import importlib.metadata as m, json, onnxruntime as ort\n"
        "names = {d.metadata['Name'].lower() for d in m.distributions()}\n"
        "print(json.dumps([sorted(names), ort.get_available_providers()]))"
    )
    answer = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True
    )
    names, providers = json.loads(answer.stdout)
    for unwanted in ("onnxruntime-gpu", "torch", "transformers"):
        if unwanted in names:
            raise RuntimeError(f"the runtime environment holds {unwanted}")
    if "grpcio" not in names:
        raise RuntimeError("the runtime environment lacks the grpc extra")
    if "onnxruntime" not in names or any(p.startswith(("CUDA", "Tensorrt")) for p in providers):
        raise RuntimeError(f"expected the CPU-only onnxruntime, found providers {providers}")
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"runtime environment: {size / 2**20:.0f} MiB, CPU-only onnxruntime", file=sys.stderr)


def grpc_model_ready(address: str, model: str) -> bool:
    """KServe v2 `ModelReady` over gRPC, the messages encoded by hand (field 1: the name; the
    answer's field 1: ready), so that this check shares no code with the server."""
    import grpc

    name = model.encode()
    assert len(name) < 128  # its length fits the one byte written below
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelReady")
        answer: bytes = call(b"\x0a" + bytes([len(name)]) + name, timeout=10)
    return answer == b"\x08\x01"


def serve_and_check(stages: dict[str, Stage], context: Path, port: int, grpc_port: int) -> None:
    server = stages["server"]
    env = {**os.environ, **env_of(stages, "server")}
    env = {k: v.replace(WORKDIR, str(context)) for k, v in env.items()}
    env["PATH"] = f"{context}/opt/venv/bin:{os.environ['PATH']}"
    env.pop("VIRTUAL_ENV", None)
    env["BUCKETSERVE_HOST"], env["BUCKETSERVE_PORT"] = "127.0.0.1", str(port)
    env["BUCKETSERVE_GRPC_PORT"] = str(grpc_port)
    command, stop = exec_form(server.last("CMD") or "[]"), server.last("STOPSIGNAL") or "SIGTERM"
    health = healthcheck_command(server.last("HEALTHCHECK") or "")
    process = subprocess.Popen(command, cwd=context, env=env)
    try:
        deadline = time.monotonic() + 240
        while subprocess.run(health, cwd=context, env=env, capture_output=True).returncode != 0:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the server never became healthy")
            time.sleep(1)
        base = f"http://127.0.0.1:{port}"
        body = json.dumps({"text": ["a container that serves", "hello"]}).encode()
        request = urllib.request.Request(
            f"{base}/predict", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        assert answer["model"] == env["BUCKETSERVE_DEFAULT_MODEL"], answer["model"]
        embeddings = [out["sentence_embedding"] for out in answer["outputs"]]
        assert [len(e) for e in embeddings] == [384, 384], "expected two 384-d embeddings"
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            assert b"bucketserve_requests_total" in response.read()
        assert grpc_model_ready(f"127.0.0.1:{grpc_port}", answer["model"]), "gRPC: not ready"
        print(f"served {answer['model']} from the image's steps (HTTP, gRPC)", file=sys.stderr)
    finally:
        if process.poll() is None:
            process.send_signal(getattr(signal, stop))
        code = process.wait(60)
    if code != 0:
        raise RuntimeError(f"the server exited with {code} after {stop}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.image.smoke", description=__doc__)
    parser.add_argument("--workdir", type=Path, help="keep the scratch folder here")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    args = parser.parse_args(argv)
    from loadtest.process import free_port

    stages = read_dockerfile()
    with tempfile.TemporaryDirectory() as scratch:
        context = args.workdir or Path(scratch)
        context.mkdir(parents=True, exist_ok=True)
        copy_context(context)
        run_scripts(stages, context)
        check_runtime_venv(context / "opt" / "venv")
        serve_and_check(stages, context, args.port or free_port(), free_port())
    return 0


if __name__ == "__main__":
    sys.exit(main())
