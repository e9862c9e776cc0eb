"""Manifests parsed strictly into the KServe SDK's own model classes, in a process of its own:
`python -m tests.kserve_parse < docs.json` prints, for each document, null or what is wrong.

(Its own process because the `kserve` package registers KServe v2's protobuf messages under
the names `tritonclient` registers them with, and one process cannot hold both.)
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import kserve.models as kserve_models
import kubernetes.client.models as kubernetes_models

CLASSES = {
    "ClusterServingRuntime": "V1alpha1ClusterServingRuntime",
    "InferenceService": "V1beta1InferenceService",
}
PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "object": (object,),
}


class Invalid(Exception):
    pass


def built(value: Any, kind: str, where: str) -> Any:
    """`value` as the SDK's class `kind` (or a list or map of them), with every field one the
    class has: the generated classes of the CRDs' schema, which ignore unknown fields when
    they deserialise, are held to them here. (The kserve package writes `list[X]` and
    `dict(str, X)`, the Kubernetes client `List[X]` and `Dict[str, X]`.)"""
    if listed := re.fullmatch(r"[lL]ist\[(.+)\]", kind):
        if not isinstance(value, list):
            raise Invalid(f"{where}: expected a list")
        return [built(v, listed[1], f"{where}[{i}]") for i, v in enumerate(value)]
    if mapped := re.fullmatch(r"(?:dict\(|Dict\[)str, (.+)[)\]]", kind):
        if not isinstance(value, dict):
            raise Invalid(f"{where}: expected a map")
        return {k: built(v, mapped[1], f"{where}.{k}") for k, v in value.items()}
    if kind in PRIMITIVES:
        if not isinstance(value, PRIMITIVES[kind]) or (kind == "bool") != isinstance(value, bool):
            raise Invalid(f"{where}: {value!r} is not a {kind}")
        return value
    klass = getattr(kserve_models, kind, None) or getattr(kubernetes_models, kind)
    if not isinstance(value, dict):
        raise Invalid(f"{where}: expected an object ({kind})")
    fields = {json_name: attr for attr, json_name in klass.attribute_map.items()}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise Invalid(f"{where}: {kind} has no field(s) {unknown}")
    try:
        return klass(
            **{
                fields[key]: built(item, klass.openapi_types[fields[key]], f"{where}.{key}")
                for key, item in value.items()
            }
        )
    except ValueError as exc:  # the class's own checks: required fields, allowed values
        raise Invalid(f"{where}: {exc}") from None


def verdict(doc: dict[str, Any]) -> str | None:
    try:
        built(doc, CLASSES[doc["kind"]], doc["kind"])
    except Invalid as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    json.dump([verdict(doc) for doc in json.load(sys.stdin)], sys.stdout)
