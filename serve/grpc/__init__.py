"""KServe v2 over gRPC (the `grpc` extra): messages in `protocol`, methods in `service`."""

from serve.grpc.service import GrpcServer

__all__ = ["GrpcServer"]
