"""The KServe v2 gRPC messages (package `inference`, service `GRPCInferenceService`), declared
here field by field rather than generated: generated code pins the protobuf runtime it may run
on, and the clients people use (`tritonclient.grpc`) pin theirs. Only what is on the wire
matters: names, numbers and types are the protocol's, so any v2 client reads them.

The subset served: liveness, readiness, metadata, Triton's `ModelConfig` (the part of its
model configuration that clients read), `ModelInfer`, and the repository extension (index,
load, unload).
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "inference"
SERVICE = f"{PACKAGE}.GRPCInferenceService"

_Field = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "bool": _Field.TYPE_BOOL,
    "int32": _Field.TYPE_INT32,
    "int64": _Field.TYPE_INT64,
    "uint32": _Field.TYPE_UINT32,
    "uint64": _Field.TYPE_UINT64,
    "float": _Field.TYPE_FLOAT,
    "double": _Field.TYPE_DOUBLE,
    "string": _Field.TYPE_STRING,
    "bytes": _Field.TYPE_BYTES,
}
TENSOR = [  # the fields of an input tensor and of an output tensor alike
    ("name", 1, "string"),
    ("datatype", 2, "string"),
    ("shape", 3, "repeated int64"),
    ("parameters", 4, "map<InferParameter>"),  # map<string, InferParameter>
    ("contents", 5, "InferTensorContents"),
]

# message -> [(field, number, type)]; "repeated T" and "map<T>" as in a .proto file, nested
# messages as "Outer.Inner".
REPOSITORY_MODEL = [  # a load's or an unload's request
    ("repository_name", 1, "string"),
    ("model_name", 2, "string"),
    ("parameters", 3, "map<ModelRepositoryParameter>"),
]

MESSAGES: dict[str, list[tuple[str, int, str]]] = {
    "ServerLiveRequest": [],
    "ServerLiveResponse": [("live", 1, "bool")],
    "ServerReadyRequest": [],
    "ServerReadyResponse": [("ready", 1, "bool")],
    "ModelReadyRequest": [("name", 1, "string"), ("version", 2, "string")],
    "ModelReadyResponse": [("ready", 1, "bool")],
    "ServerMetadataRequest": [],
    "ServerMetadataResponse": [
        ("name", 1, "string"),
        ("version", 2, "string"),
        ("extensions", 3, "repeated string"),
    ],
    "ModelMetadataRequest": [("name", 1, "string"), ("version", 2, "string")],
    "ModelMetadataResponse.TensorMetadata": [
        ("name", 1, "string"),
        ("datatype", 2, "string"),
        ("shape", 3, "repeated int64"),
    ],
    "ModelMetadataResponse": [
        ("name", 1, "string"),
        ("versions", 2, "repeated string"),
        ("platform", 3, "string"),
        ("inputs", 4, "repeated ModelMetadataResponse.TensorMetadata"),
        ("outputs", 5, "repeated ModelMetadataResponse.TensorMetadata"),
    ],
    "ModelConfigRequest": [("name", 1, "string"), ("version", 2, "string")],
    # Triton's model configuration (model_config.proto), the fields `triton_config` fills;
    # a `data_type` is its enum on the wire (a varint: DATA_TYPES[n] is the name of n).
    "ModelInput": [
        ("name", 1, "string"),
        ("data_type", 2, "int32"),
        ("dims", 4, "repeated int64"),
        ("optional", 8, "bool"),
    ],
    "ModelOutput": [
        ("name", 1, "string"),
        ("data_type", 2, "int32"),
        ("dims", 3, "repeated int64"),
    ],
    "ModelDynamicBatching": [],
    "ModelConfig": [
        ("name", 1, "string"),
        ("platform", 2, "string"),
        ("max_batch_size", 4, "int32"),
        ("input", 5, "repeated ModelInput"),
        ("output", 6, "repeated ModelOutput"),
        ("dynamic_batching", 11, "ModelDynamicBatching"),
        ("backend", 17, "string"),
    ],
    "ModelConfigResponse": [("config", 1, "ModelConfig")],
    "InferParameter": [  # every field in the oneof `parameter_choice` (ONEOFS)
        ("bool_param", 1, "bool"),
        ("int64_param", 2, "int64"),
        ("string_param", 3, "string"),
        ("double_param", 4, "double"),
        ("uint64_param", 5, "uint64"),
    ],
    "InferTensorContents": [
        ("bool_contents", 1, "repeated bool"),
        ("int_contents", 2, "repeated int32"),
        ("int64_contents", 3, "repeated int64"),
        ("uint_contents", 4, "repeated uint32"),
        ("uint64_contents", 5, "repeated uint64"),
        ("fp32_contents", 6, "repeated float"),
        ("fp64_contents", 7, "repeated double"),
        ("bytes_contents", 8, "repeated bytes"),
    ],
    "ModelInferRequest.InferInputTensor": TENSOR,
    "ModelInferRequest.InferRequestedOutputTensor": [
        ("name", 1, "string"),
        ("parameters", 2, "map<InferParameter>"),
    ],
    "ModelInferRequest": [
        ("model_name", 1, "string"),
        ("model_version", 2, "string"),
        ("id", 3, "string"),
        ("parameters", 4, "map<InferParameter>"),
        ("inputs", 5, "repeated ModelInferRequest.InferInputTensor"),
        ("outputs", 6, "repeated ModelInferRequest.InferRequestedOutputTensor"),
        ("raw_input_contents", 7, "repeated bytes"),
    ],
    "ModelInferResponse.InferOutputTensor": TENSOR,
    "ModelInferResponse": [
        ("model_name", 1, "string"),
        ("model_version", 2, "string"),
        ("id", 3, "string"),
        ("parameters", 4, "map<InferParameter>"),
        ("outputs", 5, "repeated ModelInferResponse.InferOutputTensor"),
        ("raw_output_contents", 6, "repeated bytes"),
    ],
    "RepositoryIndexRequest": [("repository_name", 1, "string"), ("ready", 2, "bool")],
    "RepositoryIndexResponse.ModelIndex": [
        ("name", 1, "string"),
        ("version", 2, "string"),
        ("state", 3, "string"),
        ("reason", 4, "string"),
    ],
    "RepositoryIndexResponse": [("models", 1, "repeated RepositoryIndexResponse.ModelIndex")],
    "ModelRepositoryParameter": [  # every field in the oneof `parameter_choice` (ONEOFS)
        ("bool_param", 1, "bool"),
        ("int64_param", 2, "int64"),
        ("string_param", 3, "string"),
        ("bytes_param", 4, "bytes"),
    ],
    "RepositoryModelLoadRequest": REPOSITORY_MODEL,
    "RepositoryModelLoadResponse": [],
    "RepositoryModelUnloadRequest": REPOSITORY_MODEL,
    "RepositoryModelUnloadResponse": [],
}
DATA_TYPES = (  # Triton's DataType enum, in the order of its numbers
    "TYPE_INVALID",
    "TYPE_BOOL",
    "TYPE_UINT8",
    "TYPE_UINT16",
    "TYPE_UINT32",
    "TYPE_UINT64",
    "TYPE_INT8",
    "TYPE_INT16",
    "TYPE_INT32",
    "TYPE_INT64",
    "TYPE_FP16",
    "TYPE_FP32",
    "TYPE_FP64",
    "TYPE_STRING",
    "TYPE_BF16",
)
# message -> the oneof its fields all belong to: which one was sent is the parameter's type
ONEOFS = {"InferParameter": "parameter_choice", "ModelRepositoryParameter": "parameter_choice"}
# method -> (request, response)
METHODS = {
    name: (f"{name}Request", f"{name}Response")
    for name in (
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelConfig",
        "ModelInfer",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    )
}


def _add_field(
    message: descriptor_pb2.DescriptorProto, path: str, name: str, number: int, kind: str
) -> None:
    """Declare a field of `message` (the message named `path`)."""
    field = message.field.add(name=name, number=number)
    field.label = _Field.LABEL_OPTIONAL
    if kind.startswith("map<"):  # a map is a repeated nested XEntry {key = 1; value = 2}
        entry = message.nested_type.add(name=name.title().replace("_", "") + "Entry")
        entry.options.map_entry = True
        _add_field(entry, f"{path}.{entry.name}", "key", 1, "string")
        _add_field(entry, f"{path}.{entry.name}", "value", 2, kind[4:-1])
        field.label = _Field.LABEL_REPEATED
        field.type = _Field.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{path}.{entry.name}"
        return
    if kind.startswith("repeated "):
        field.label = _Field.LABEL_REPEATED
        kind = kind.removeprefix("repeated ")
    if kind in _SCALARS:
        field.type = _SCALARS[kind]
    else:
        field.type = _Field.TYPE_MESSAGE
        field.type_name = f".{PACKAGE}.{kind}"


def _file() -> descriptor_pb2.FileDescriptorProto:
    file = descriptor_pb2.FileDescriptorProto(
        name="bucketserve/kserve_v2.proto", package=PACKAGE, syntax="proto3"
    )
    declared: dict[str, descriptor_pb2.DescriptorProto] = {}
    for path in sorted(MESSAGES, key=lambda p: p.count(".")):  # outer messages first
        outer, _, inner = path.rpartition(".")
        message = (declared[outer].nested_type if outer else file.message_type).add(
            name=inner or path
        )
        declared[path] = message
    for path, fields in MESSAGES.items():
        for name, number, kind in fields:
            _add_field(declared[path], path, name, number, kind)
        if path in ONEOFS:
            declared[path].oneof_decl.add(name=ONEOFS[path])
            for field in declared[path].field:
                field.oneof_index = 0
    return file


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {
        path: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{path}"))
        for path in MESSAGES
    }


MESSAGE_CLASSES = _classes()
