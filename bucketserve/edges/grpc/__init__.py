"""KServe v2 over gRPC (the `grpc` extra): the wire in `messages`, requests decoded by
`decoding`, the methods in `service`, the port in `listener`."""

from bucketserve.edges.grpc.listener import GrpcListener

__all__ = ["GrpcListener"]
