"""The protocol edges, where a request enters: HTTP (`/predict`, OpenAI's `/v1`, KServe v2) and
KServe v2 over gRPC. An edge decodes its bytes into one call to the core's engine, and encodes
what comes back; it decides nothing about a request itself. Imports the engine's call and
registry, model control, and the shared modules; never load time, the scheduler or the
runtime."""
