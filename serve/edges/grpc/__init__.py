"""KServe v2 over gRPC (the `grpc` extra): the wire in `messages`, the methods in `service`."""

from serve.edges.grpc.service import GrpcServer

__all__ = ["GrpcServer"]
