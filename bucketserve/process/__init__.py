"""The process: the `bucketserve` command, and the server process, which wires every part once
(engine, model control, metrics, tracing, API keys), starts HTTP and gRPC on them as equals,
and drains them on SIGTERM. Imports anything below it; nothing imports it."""
