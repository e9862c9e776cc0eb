"""Every export in the zoo, under every binding, over HTTP: concurrent requests of mixed
lengths, and every answer equal (within the tolerance) to the model run on that sequence
alone, unpadded. Models that batching moves are served one sequence per run and exact."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bucketserve.core.bucketing import Policy
from bucketserve.core.layout import InputRole, Layout
from bucketserve.edges.kserve import LENGTHS_INPUT, with_batch_axis
from bucketserve.edges.tensors import DATATYPE_OF
from bucketserve.loading import ModelSpec
from bucketserve.loading.check import random_sequences
from bucketserve.loading.pad_safe import LENGTHS_INPUT as PAD_SAFE_INPUT
from bucketserve.runtime.sessions import GraphFile, side_session
from tests.engines import make_engine, serving, spec_of
from tests.zoo import ZOO, add_to

BINDINGS = ["shared-session", "session-per-key", "mutable"]


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("name", list(ZOO))
async def test_every_answer_equals_the_model_alone(
    tmp_models: Path, name: str, binding: str
) -> None:
    add_to(tmp_models, name)
    engine = make_engine(tmp_models, binding=binding, max_queue_delay_ms=5)
    model = engine.model(name)
    policy = Policy(ZOO[name].policy)
    assert model.plan.policy is policy
    assert model.binding == (binding if policy is Policy.BUCKETS else "mutable")
    rules = model.info.rules
    assert rules.min_length == ZOO[name].min_length
    rng = np.random.default_rng(len(name))
    lengths = [int(n) for n in rng.integers(rules.min_length, model.plan.max_length + 1, 48)]
    sequences = random_sequences(rules, lengths, seed=3, scaled=True)
    requests = [sequences[i : i + 3] for i in range(0, len(sequences), 3)]

    def as_sent(sequence: np.ndarray) -> list[Any]:  # in the input's own axes, less the batch
        return np.moveaxis(sequence, 0, rules.time_axis).tolist()  # type: ignore[no-any-return]

    async with serving(engine) as client:
        responses = await asyncio.gather(
            *(
                client.post("/predict", json={"model": name, "sequences": [as_sent(s) for s in r]})
                for r in requests
            )
        )

    reference = Alone(spec_of(tmp_models, name))
    tolerance = model.info.invariance.tolerance  # 1e-4, whatever the policy
    steps = ZOO[name].steps or (lambda n: n)
    for request, response in zip(requests, responses, strict=True):
        assert response.status_code == 200, response.text
        for seq, answer in zip(request, response.json()["outputs"], strict=True):
            for output, alone in reference(seq).items():
                got = np.asarray(answer[output], alone.dtype)
                assert got.shape == alone.shape, (output, len(seq))
                tensor = model.info.layout.output(output)
                if tensor.per_step:
                    assert got.shape[tensor.row_time_axis] == steps(len(seq)), (output, len(seq))
                np.testing.assert_allclose(got, alone, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", list(ZOO))
async def test_every_answer_over_kserve_v2_equals_the_model_alone(
    tmp_models: Path, name: str
) -> None:
    """The same over KServe v2: requests of three rows padded to their longest, in the model's
    own axes, each row's length told the model's way (its mask, the model's way round; its
    lengths input; else `sequence_lengths`), outputs read back in their own axes."""
    add_to(tmp_models, name)
    engine = make_engine(tmp_models, max_queue_delay_ms=5)
    model = engine.model(name)
    rules, layout = model.info.rules, model.info.layout
    rng = np.random.default_rng(len(name) + 1)
    lengths = [int(n) for n in rng.integers(rules.min_length, model.plan.max_length + 1, 12)]
    sequences = random_sequences(rules, lengths, seed=4, scaled=True)
    rows = 3 if layout.sequence.tensor.batch_axis is not None else 1  # (none: one, as is)
    requests = [sequences[i : i + rows] for i in range(0, len(sequences), rows)]
    async with serving(engine) as client:
        responses = await asyncio.gather(
            *(client.post(f"/v2/models/{name}/infer", json=v2_body(layout, r)) for r in requests)
        )

    reference = Alone(spec_of(tmp_models, name))
    tolerance = model.info.invariance.tolerance
    for request, response in zip(requests, responses, strict=True):
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        for row, seq in enumerate(request):
            for output, alone in reference(seq).items():
                tensor = with_batch_axis(layout.output(output))
                sent = outputs[output]
                rows = tensor.to_batch_major(np.asarray(sent["data"]).reshape(sent["shape"]))
                got = rows[row]
                if tensor.per_step:  # zeros past the row's own steps
                    steps = alone.shape[tensor.row_time_axis]
                    assert not got[steps:].any(), (output, len(seq))
                    got = tensor.row_as_sent(got[:steps])
                np.testing.assert_allclose(got, alone, rtol=tolerance, atol=tolerance)


def v2_body(layout: Layout, sequences: list[np.ndarray]) -> dict[str, Any]:
    """A v2 request of `sequences` padded to their longest, in the model's own axes."""
    rows, longest = len(sequences), max(len(s) for s in sequences)
    lengths = np.array([len(s) for s in sequences])
    sequence = layout.sequence
    padded = np.full((rows, longest, *sequences[0].shape[1:]), sequence.fill, sequences[0].dtype)
    for row, seq in enumerate(sequences):
        padded[row, : len(seq)] = seq
    tensors = {sequence.tensor.name: sequence.tensor.to_model_axes(padded)}
    for inp in layout.inputs:
        if inp.role is InputRole.MASK:
            real = np.arange(longest) < lengths[:, None]
            tensors[inp.tensor.name] = inp.tensor.to_model_axes(
                (real != bool(inp.fill)).astype(inp.tensor.dtype)
            )
        elif inp.role is InputRole.LENGTHS:
            tensors[inp.tensor.name] = lengths.astype(inp.tensor.dtype)
    if not any(i.role in (InputRole.MASK, InputRole.LENGTHS) for i in layout.inputs):
        tensors[LENGTHS_INPUT] = lengths
    return {
        "inputs": [
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": DATATYPE_OF[array.dtype],
                "data": array.ravel().tolist(),
            }
            for name, array in tensors.items()
        ]
    }


class Alone:
    """The model as ONNX Runtime runs it on one sequence, unpadded, with no help from the
    server's layout: its outputs as they come, less a leading batch axis of 1."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.session = side_session(GraphFile(spec.onnx_path, ("CPUExecutionProvider",)))

    def __call__(self, sequence: np.ndarray) -> dict[str, np.ndarray]:
        """(A model that runs only at multiples of a width gets the sequence padded with zeros
        up to one, as its package pads a page image; its map's width, the last dim, is cut
        back to the sequence's.)"""
        multiple, length = ZOO[self.spec.name].multiple, len(sequence)
        if multiple == 1:
            return self._run(sequence)
        width = -(-length // multiple) * multiple
        padded = np.zeros((width, *sequence.shape[1:]), sequence.dtype)
        padded[:length] = sequence
        return {name: out[..., :length] for name, out in self._run(padded).items()}

    def _run(self, sequence: np.ndarray) -> dict[str, np.ndarray]:
        config, feeds = self.spec.config, {}
        for name, cfg in config.inputs.items():
            graph = self.spec.signature.inputs[name]
            if cfg.role is InputRole.CONSTANT:  # (no axes: the value, in the graph's shape)
                feeds[name] = np.full(graph.dims, cfg.value).astype(graph.dtype)
                continue
            axes = self.spec.axes.inputs[name]
            if cfg.role in (InputRole.TOKENS, InputRole.FEATURES) and axes.batch is None:
                value = np.moveaxis(sequence, 0, axes.time)  # (an input without a batch axis)
            elif cfg.role in (InputRole.TOKENS, InputRole.FEATURES):
                value = np.moveaxis(sequence[None], (0, 1), (axes.batch, axes.time))
            elif cfg.role is InputRole.LENGTHS:
                value = np.array([len(sequence)])
            elif cfg.role is InputRole.STATE:
                shape = [1 if isinstance(d, str) or d is None else d for d in graph.dims]
                value = np.full(shape, cfg.fill)
            else:  # a mask (as the package's own code makes it) or token types
                fill = ZOO[self.spec.name].mask_alone if cfg.role is InputRole.MASK else 0
                value = np.moveaxis(
                    np.full((1, len(sequence)), fill), (0, 1), (axes.batch, axes.time)
                )
            feeds[name] = np.ascontiguousarray(value).astype(graph.dtype)
        names = list(config.outputs)
        outputs = dict(zip(names, self.session.run(names, feeds), strict=True))
        return {name: self._less_batch(name, out) for name, out in outputs.items()}

    def _less_batch(self, name: str, out: np.ndarray) -> np.ndarray:
        batch = ZOO[self.spec.name].batch_axes.get(name, 0)
        return out if batch is None else np.take(out, 0, axis=batch)


@pytest.mark.parametrize("name", ["unmasked-bilstm", "unmasked-bigru", "strided-bilstm"])
async def test_a_pad_safe_copy_keeps_the_models_contract(tmp_models: Path, name: str) -> None:
    """Served from the copy whose RNNs the server gives each row's length, a tagger shows its
    own contract: its inputs alone in v2 metadata and the config route, its pad id reserved;
    padded ids sent alone (each row ends at its first pad id, as the docs say) and padded ids
    with `sequence_lengths` are both answered exactly; nothing names the server's input."""
    add_to(tmp_models, name)
    engine = make_engine(tmp_models, max_queue_delay_ms=5)
    model = engine.model(name)
    assert model.info.served_config["check"]["pad_safe"]["served"] == "rewritten"
    rules, layout = model.info.rules, model.info.layout
    assert rules.reserved_ids == (0,)
    rng = np.random.default_rng(5)
    lengths = [int(n) for n in rng.integers(1, model.plan.max_length + 1, 9)]
    sequences = random_sequences(rules, lengths, seed=6)
    requests = [sequences[i : i + 3] for i in range(0, len(sequences), 3)]
    with_lengths = [v2_body(layout, r) for r in requests]
    ids_alone = [
        {"inputs": [t for t in body["inputs"] if t["name"] != LENGTHS_INPUT]}
        for body in with_lengths
    ]
    async with serving(engine) as client:
        metadata = (await client.get(f"/v2/models/{name}")).json()
        config = (await client.get(f"/v2/models/{name}/config")).json()
        answers = await asyncio.gather(
            *(client.post(f"/v2/models/{name}/infer", json=b) for b in with_lengths + ids_alone)
        )
    graph_inputs = [i.tensor.name for i in layout.inputs if i.role is InputRole.TOKENS]
    assert [i["name"] for i in metadata["inputs"]] == graph_inputs
    assert PAD_SAFE_INPUT not in config["inputs"]
    assert [i["name"] for i in config["input"]] == graph_inputs
    reference = Alone(spec_of(tmp_models, name))
    for answer, request in zip(answers, requests + requests, strict=True):
        assert answer.status_code == 200, answer.text
        assert PAD_SAFE_INPUT not in answer.text
        outputs = {o["name"]: o for o in answer.json()["outputs"]}
        for row, seq in enumerate(request):
            for output, alone in reference(seq).items():
                tensor = with_batch_axis(layout.output(output))
                sent = outputs[output]
                got = tensor.to_batch_major(np.asarray(sent["data"]).reshape(sent["shape"]))[row]
                got = tensor.row_as_sent(got[: alone.shape[tensor.row_time_axis]])
                np.testing.assert_allclose(got, alone, rtol=1e-4, atol=1e-4)
