"""The contract, served: the OpenAPI document with the repository's real model names and the
server's limits, and, when asked for, interactive docs at /docs whose assets the server serves
itself (no CDN).

The document is the one the schemas write; what this adds is what only the running server knows
(which models it has, how many sequences a request may hold) and the docs page, which is a
setting because a production server has no use for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Response
from fastapi.responses import HTMLResponse

from bucketserve.errors import ConfigError

ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css")
KEY_SCHEME = "apiKey"
# Swagger UI over the document. With a key (KEY_REQUIRED true), the page first asks for it; it
# stays in the page, sent as a bearer token with every call the page makes, the document's too.
PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>bucketserve</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/docs/swagger-ui.css">
</head>
<body>
<form id="key" hidden style="margin: 2em; font-family: sans-serif">
<label>API key <input id="secret" type="password" autocomplete="off" required></label>
<button>Open the docs</button>
</form>
<div id="swagger-ui"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script>
function show(key) {
  SwaggerUIBundle({
    url: "/openapi.json",
    dom_id: "#swagger-ui",
    requestInterceptor: (request) => {
      if (key) request.headers.Authorization = "Bearer " + key;
      return request;
    },
  });
}
const form = document.getElementById("key");
if (KEY_REQUIRED) {
  form.hidden = false;
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    form.hidden = true;
    show(document.getElementById("secret").value);
  });
} else {
  show(null);
}
</script>
</body>
</html>
"""


def describe_server(
    app: FastAPI,
    names: Iterable[str],
    versions: Iterable[str],
    max_sequences: int,
    exact: Mapping[str, tuple[bool, ...]],
) -> None:
    """The document as this server takes requests: model names (the `{name}` path parameter,
    a body's `model` where names are not hints: an alias too) and `{version}`s are the
    repository's, and /predict takes at most `max_sequences` items. `exact`: each POST path's
    documented bodies, whether each takes only the names served (`table.exact_names`; where
    a name is a hint, a body's `model` is any name)."""
    known = {"name": sorted(set(names)), "version": sorted(set(versions))}
    models = {"type": "string", "enum": known["name"]}
    document = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = document()
            for item in schema["paths"].values():
                for operation in item.values():
                    for param in operation.get("parameters", []):
                        values = known.get(param["name"]) if param["in"] == "path" else None
                        if values:
                            param["schema"] = {"type": "string", "enum": values}
            for path, item in schema["paths"].items():
                if path not in exact:  # (no body of the table's: no model named)
                    continue
                body = item["post"]["requestBody"]["content"]["application/json"]["schema"]
                bodies = body["anyOf"] if len(exact[path]) > 1 else [body]
                for each, exact_names in zip(bodies, exact[path], strict=True):
                    for form in _forms(each):
                        fields = form.get("properties", {})
                        if "model" in fields and exact_names:
                            fields["model"] = _named(fields["model"], models)
                        for field in ("sequences", "text"):  # (/predict's own)
                            if field in fields:
                                fields[field]["maxItems"] = max_sequences
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _forms(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The body forms a schema allows: itself, or each of its alternatives (nested)."""
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if not alternatives:
        return [schema]
    return [form for alternative in alternatives for form in _forms(alternative)]


def _named(field: dict[str, Any], models: dict[str, Any]) -> dict[str, Any]:
    """A body's `model` field as the names served (or null, where it may be left out)."""
    rest = {k: v for k, v in field.items() if k not in ("anyOf", "minLength", "type")}
    optional = "anyOf" in field or field.get("default", "") is None
    return rest | ({"anyOf": [models, {"type": "null"}]} if optional else models)


def document_key(app: FastAPI, is_open: Callable[[str], bool]) -> None:
    """With an API key, the document says so: a bearer scheme, and a 401 in the route's own
    error form on every route that needs the key (`is_open` tells the others)."""
    document = app.openapi
    patched: dict[str, dict[str, Any]] = {}

    def openapi() -> dict[str, Any]:
        if not patched:
            schema = document()
            schemes = schema.setdefault("components", {}).setdefault("securitySchemes", {})
            schemes[KEY_SCHEME] = {"type": "http", "scheme": "bearer"}
            for path, item in schema["paths"].items():
                if is_open(path):
                    continue
                for operation in item.values():
                    responses = operation.setdefault("responses", {})
                    others = [responses[s] for s in ("422", "404", "400") if s in responses]
                    form: dict[str, Any] = others[0] if others else {}
                    responses["401"] = {
                        "description": "no API key, or not one of the server's",
                        **({"content": form["content"]} if "content" in form else {}),
                    }
                    operation["security"] = [{KEY_SCHEME: []}]
            patched["schema"] = schema
        return patched["schema"]

    app.openapi = openapi  # type: ignore[method-assign]


def serve_docs(app: FastAPI, key_required: bool) -> None:
    """Swagger UI at /docs, its script and style read from the `swagger-ui-bundle` package
    (the `docs` extra) and served from here; with `key_required`, a page that asks for the
    key (the page and its assets are open: `bucketserve.edges.auth`)."""
    try:
        bundle = resources.files("swagger_ui_bundle") / "vendor"
    except ModuleNotFoundError:
        raise ConfigError(
            "docs: the docs page needs the docs extra: pip install 'bucketserve[docs]'"
        ) from None
    folder = next(p for p in bundle.iterdir() if p.name.startswith("swagger-ui-"))
    assets = {name: (folder / name).read_bytes() for name in ASSETS}
    kinds = {"js": "text/javascript", "css": "text/css"}

    page = PAGE.replace("KEY_REQUIRED", "true" if key_required else "false")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/docs/{asset}", include_in_schema=False)
    async def asset(asset: str) -> Response:
        if asset not in assets:
            raise HTTPException(404, "no such docs asset")
        return Response(assets[asset], media_type=kinds[asset.rsplit(".", 1)[1]])
