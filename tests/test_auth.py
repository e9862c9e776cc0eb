"""The API key: required on every route of both protocols but health and readiness, in the
route's error form (OpenAI's on /v1), compared with `hmac.compare_digest`, read from a flag,
the environment or a file of keys, and never in a log line; the tenant it names, and the one
a gateway's key names in the tenant header (never another key's)."""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bucketserve.edges.auth import ApiKeys
from bucketserve.errors import ConfigError, Forbidden, MalformedRequest
from bucketserve.loading import load_engine
from bucketserve.settings import Settings
from loadtest.process import free_port
from tests.engines import serving
from tests.helpers import error_of, server_process

KEY = "sk-test-4f2a9c0e7b1d"
OLD_KEY = "sk-old-0b5e1a"
BEARER = {"Authorization": f"Bearer {KEY}"}
OPEN = ["/v2/health/live", "/v2/health/ready", "/v2/models/tiny-encoder/ready"]
GUARDED = [  # (method, path, body): one of every kind of route
    ("POST", "/predict", {"sequences": [[5, 6, 7]]}),
    ("POST", "/v1/embeddings", {"model": "tiny-encoder", "input": [5, 6, 7]}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/models/tiny-encoder", None),
    ("GET", "/v2", None),
    ("GET", "/v2/models/tiny-encoder", None),
    ("GET", "/v2/models/tiny-encoder/config", None),
    ("POST", "/v2/repository/index", None),
    (
        "POST",
        "/v2/models/tiny-encoder/infer",
        {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [5, 6]}]},
    ),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/no/such/route", None),
]


@pytest.fixture
def models(repository: Callable[..., Path]) -> Path:
    return repository("tiny-encoder")


@pytest.fixture
async def client(models: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = Settings(models=models, api_key=KEY)
    async with serving(load_engine(settings)) as client:
        yield client


async def send(
    client: httpx.AsyncClient, method: str, path: str, body: Any, headers: dict[str, str]
) -> httpx.Response:
    return await client.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize(("method", "path", "body"), GUARDED, ids=[g[1] for g in GUARDED])
async def test_every_route_needs_the_key(
    client: httpx.AsyncClient, method: str, path: str, body: Any
) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        refused = await send(client, method, path, body, headers)
        assert refused.status_code == 401, (headers, refused.text)
        assert refused.headers["www-authenticate"] == "Bearer"
        assert error_of(refused)[0] == "unauthorized"
        body = refused.json()  # (in its route's form: the hosted APIs' on /v1, else TEI's)
        hosted = path.startswith("/v1/") or path in ("/v2/rerank", "/v2/embed")
        assert isinstance(body["error"], dict) == hosted
        assert ("detail" in body) == hosted
    allowed = await send(client, method, path, body, BEARER)
    assert allowed.status_code != 401
    assert allowed.status_code < 500


async def test_the_document_says_which_routes_need_the_key(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json", headers=BEARER)).json()
    assert document["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    paths = document["paths"]
    predict = paths["/predict"]["post"]
    assert predict["security"] == [{"apiKey": []}]
    assert "ErrorBody" in str(predict["responses"]["401"]["content"])
    embeddings = paths["/v1/embeddings"]["post"]["responses"]["401"]
    assert "HostedError" in str(embeddings["content"])  # the route's own error form
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/{name}/ready"):
        operation = paths[path]["get"]
        assert "security" not in operation
        assert "401" not in operation["responses"]


@pytest.mark.parametrize("path", OPEN)
async def test_health_and_readiness_stay_open(client: httpx.AsyncClient, path: str) -> None:
    assert (await client.get(path)).status_code == 200


async def test_metrics_open_only_when_the_setting_says(models: Path) -> None:
    settings = Settings(models=models, api_key=KEY, open_metrics=True)
    async with serving(load_engine(settings)) as client:
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert 'bucketserve_rejected_total{reason="unauthorized"}' not in metrics.text
        assert (await client.post("/predict", json={"sequences": [[5]]})).status_code == 401
        counted = (await client.get("/metrics")).text
    assert 'bucketserve_rejected_total{reason="unauthorized"} 1.0' in counted


async def test_the_key_is_compared_in_constant_time(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(given: bytes, key: bytes) -> bool:
        calls.append((given, key))
        return real(given, key)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert (await client.get("/v2", headers={"Authorization": "Bearer guess"})).status_code == 401
    assert (await client.get("/v2", headers=BEARER)).status_code == 200
    assert calls == [(b"guess", KEY.encode()), (KEY.encode(), KEY.encode())]


def test_keys_from_a_file_for_rotation(tmp_path: Path, models: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# the new key, then the old one until clients move\n{KEY}\n\n{OLD_KEY}\n")
    settings = Settings(models=models, api_key_file=keys)
    assert list(settings.api_keys()) == [KEY, OLD_KEY]
    both = Settings(models=models, api_key="sk-flag", api_key_file=keys)
    assert list(both.api_keys()) == ["sk-flag", KEY, OLD_KEY]
    assert list(Settings.from_env({"BUCKETSERVE_API_KEY": KEY}).api_keys()) == [KEY]
    # unnamed keys are one tenant, "" (a rotation's two keys keep what they made); a name
    # given in front of a key names its tenant, so a rotation's two keys are one tenant
    assert settings.api_keys() == {KEY: "", OLD_KEY: ""}
    keys.write_text(f"search {KEY}\nsearch {OLD_KEY}\nindexer sk-other\n")
    assert settings.api_keys() == {KEY: "search", OLD_KEY: "search", "sk-other": "indexer"}
    assert settings.gateway_keys() == frozenset()
    keys.write_text(f"search {KEY} extra\n")
    with pytest.raises(ConfigError, match="a name and a key"):
        settings.api_keys()
    keys.write_text(f"search {KEY}\nedge {OLD_KEY} gateway\n")
    with pytest.raises(ConfigError, match="set --tenant-header"):
        settings.gateway_keys()
    behind = Settings(models=models, api_key_file=keys, tenant_header="X-Tenant")
    assert behind.api_keys() == {KEY: "search", OLD_KEY: "edge"}
    assert behind.gateway_keys() == {OLD_KEY}
    keys.write_text("# nothing here\n")
    with pytest.raises(ConfigError, match="holds no key"):
        settings.api_keys()
    with pytest.raises(ConfigError, match="api_key_file"):
        Settings(api_key_file=tmp_path / "missing").api_keys()
    with pytest.raises(ConfigError, match="printable ASCII"):
        Settings(api_key="two words").api_keys()


def test_the_tenant_header_names_a_tenant_only_for_a_gateways_key() -> None:
    alice, bob, edge = ["Bearer sk-alice"], ["Bearer sk-bob"], ["Bearer sk-edge"]
    keys = ApiKeys(
        {"sk-alice": "alice", "sk-bob": "bob", "sk-edge": "edge"},
        tenant_header="X-Tenant",
        gateways={"sk-edge"},
    )
    assert keys.tenant(edge, ["carol"]) == "carol"
    assert keys.tenant(edge, []) == keys.tenant(edge, [""]) == "edge"
    assert keys.tenant(bob, ["bob"]) == "bob"  # (its own: nothing to refuse)
    for named in ("carol", "alice"):
        with pytest.raises(Forbidden, match="may not name a tenant in X-Tenant"):
            keys.tenant(bob, [named])
    for taken in ("alice", "job:batch_0123"):  # (a key's, a bulk job's)
        with pytest.raises(Forbidden, match="names the tenant of an API key or a bulk job"):
            keys.tenant(edge, [taken])
    long = "t" * 256
    assert keys.tenant(edge, [long]) == long  # (the longest taken, whole)
    with pytest.raises(MalformedRequest, match="at most 256 characters"):
        keys.tenant(edge, [long + "x"])
    with pytest.raises(MalformedRequest, match="2 X-Tenant headers"):
        keys.tenant(edge, ["carol", "dave"])
    # no key marked: keys of one tenant (one key, or a rotation's two) may name tenants,
    # keys of two may not; without keys, the gateway is whoever reaches the port
    one = ApiKeys({"sk-1": "", "sk-2": ""}, tenant_header="X-Tenant")
    assert one.tenant(["Bearer sk-2"], ["carol"]) == "carol"
    two = ApiKeys({"sk-alice": "alice", "sk-bob": "bob"}, tenant_header="X-Tenant")
    with pytest.raises(Forbidden):
        two.tenant(alice, ["carol"])
    assert ApiKeys((), tenant_header="X-Tenant").tenant([], ["carol"]) == "carol"
    assert ApiKeys({"sk-alice": "alice"}).tenant(alice, ["carol"]) == "alice"  # (no header)


async def test_every_key_of_the_file_is_accepted(tmp_path: Path, models: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n{OLD_KEY}\n")
    settings = Settings(models=models, api_key_file=keys)
    async with serving(load_engine(settings)) as client:
        for key in (KEY, OLD_KEY):
            answer = await client.get("/v2", headers={"Authorization": f"bearer {key}"})
            assert answer.status_code == 200


async def test_the_key_is_never_logged(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await client.get("/v2", headers={"Authorization": f"Bearer {KEY}x"})
    await client.post("/predict", json={"sequences": [[99999]]}, headers=BEARER)  # a 422
    await client.get("/v2", headers=BEARER)
    assert KEY not in caplog.text
    assert KEY not in repr(Settings(api_key=KEY))


async def test_the_openai_sdk_sends_its_key(client: httpx.AsyncClient) -> None:
    openai = pytest.importorskip("openai")
    wrong = openai.AsyncOpenAI(base_url="http://test/v1", api_key="sk-wrong", http_client=client)
    with pytest.raises(openai.AuthenticationError) as refused:
        await wrong.embeddings.create(model="tiny-encoder", input=[5, 6])
    assert refused.value.body["type"] == "invalid_request_error"
    right = openai.AsyncOpenAI(base_url="http://test/v1", api_key=KEY, http_client=client)
    answer = await right.embeddings.create(model="tiny-encoder", input=[5, 6])
    assert len(answer.data[0].embedding) == 64


# -- the full tier: a server process, both protocols ------------------------------------------


@pytest.mark.slow
def test_both_protocols_of_a_server_process(tmp_path: Path, models: Path) -> None:
    grpc = pytest.importorskip("grpc")
    grpcclient = pytest.importorskip("tritonclient.grpc")
    grpc_service = pytest.importorskip("tritonclient.grpc.service_pb2")
    httpclient = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n")
    port = free_port()
    flags = ("--api-key-file", str(keys), "--grpc-port", str(port))
    with server_process(models, *flags) as (_, url, log):
        grpc_client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert grpc_client.is_server_live()  # open, without a key
        assert grpc_client.is_server_ready()
        assert grpc_client.is_model_ready("tiny-encoder")
        with pytest.raises(InferenceServerException) as refused:
            grpc_client.get_model_metadata("tiny-encoder")
        assert "UNAUTHENTICATED" in str(refused.value.status())
        with pytest.raises(InferenceServerException):
            grpc_client.get_model_metadata("tiny-encoder", headers={"authorization": "Bearer no"})
        grpc_meta = grpc_client.get_model_metadata(
            "tiny-encoder", headers={"authorization": f"Bearer {KEY}"}
        )
        assert grpc_meta.name == "tiny-encoder"
        # (An upper-case metadata name never leaves the client: gRPC's own library refuses it,
        # INTERNAL "Illegal header key", before a byte is sent. Nothing a server can change.)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        metadata_of = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelMetadata",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda b: b,
        )
        two = [("authorization", "Bearer wrong"), ("authorization", f"Bearer {KEY}")]
        with pytest.raises(grpc.RpcError) as twice:
            metadata_of(grpc_service.ModelMetadataRequest(name="tiny-encoder"), metadata=two)
        assert twice.value.code() == grpc.StatusCode.UNAUTHENTICATED
        channel.close()

        http_client = httpclient.InferenceServerClient(url.removeprefix("http://"))
        assert http_client.is_server_ready()
        with pytest.raises(InferenceServerException):
            http_client.get_model_metadata("tiny-encoder")
        metadata = http_client.get_model_metadata("tiny-encoder", headers=BEARER)
        assert metadata["name"] == "tiny-encoder"
        assert httpx.get(f"{url}/metrics").status_code == 401
        http_client.close()  # (the server's drain waits for a client's idle connections)
        grpc_client.close()
    assert KEY not in log.read_text()


async def test_two_authorization_headers_are_refused(client: httpx.AsyncClient) -> None:
    """A wrong key then a valid one (or the valid one twice): refused, whichever a proxy in
    front would have read."""
    for first in ("Bearer wrong", f"Bearer {KEY}"):
        headers = [("Authorization", first), ("Authorization", f"Bearer {KEY}")]
        refused = await client.get("/v2/models/tiny-encoder", headers=headers)
        assert refused.status_code == 401
        assert "2 authorizations sent" in error_of(refused)[1]


def test_an_empty_key_refuses_to_start() -> None:
    """BUCKETSERVE_API_KEY="" would otherwise leave every route open, silently."""
    for given in ({"BUCKETSERVE_API_KEY": ""}, {"BUCKETSERVE_API_KEY": "  "}):
        with pytest.raises(ConfigError, match="api_key: empty"):
            Settings.from_env(given)


async def test_an_open_route_says_nothing_of_the_models(client: httpx.AsyncClient) -> None:
    unknown = await client.get("/v2/models/no-such-model/ready")
    assert unknown.status_code == 404
    assert "tiny-encoder" not in unknown.text


async def test_a_key_naming_another_tenant_over_grpc_is_permission_denied(models: Path) -> None:
    """gRPC's metadata follows the header's rule, in gRPC's words for a refusal."""
    import grpc

    from bucketserve.control import Control
    from bucketserve.edges.grpc import GrpcListener
    from bucketserve.metrics import Metrics
    from bucketserve.process.wiring import grpc_options

    service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
    port = free_port()
    engine = load_engine(Settings(models=models, grpc_port=port))
    keys = ApiKeys({"sk-alice": "alice", "sk-bob": "bob"}, tenant_header="X-Tenant")
    async with serving(engine):
        options = grpc_options(engine.settings, engine.tracing)
        listener = GrpcListener(engine, Control(engine, None), Metrics(), keys, options)
        await listener.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                method = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
                request = service_pb2.ModelInferRequest(model_name="tiny-encoder")
                metadata = (("authorization", "Bearer sk-bob"), ("x-tenant", "alice"))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await method(request.SerializeToString(), metadata=metadata)
        finally:
            await listener.stop()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not name a tenant" in str(refused.value.details())
