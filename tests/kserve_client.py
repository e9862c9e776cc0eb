"""KServe's own v2 REST client, `InferenceRESTClient`, unchanged, in a process of its own (see
tests/kserve_parse.py for why): `python -m tests.kserve_client URL MODEL` sends the same token
ids as JSON and as binary tensors and prints, as JSON, each answer's outputs by name."""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

IDS = np.array([[5, 9, 2]], np.int64)


async def main(url: str, model: str) -> None:
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=60))
    answers = []
    for binary in (False, True):
        ids = InferInput("input_ids", list(IDS.shape), "INT64")
        ids.set_data_from_numpy(IDS, binary_data=binary)
        request = InferRequest(model_name=model, infer_inputs=[ids], request_id="kserve-1")
        response = await client.infer(url, request, model_name=model)
        answers.append({out.name: out.as_numpy().tolist() for out in response.outputs})
    await client.close()
    print(json.dumps(answers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
