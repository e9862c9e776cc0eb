"""The process shell: the `bucketserve` command, and the server process that starts the engine
and runs the HTTP and gRPC edges on it until SIGTERM drains them."""
