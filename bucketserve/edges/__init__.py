"""The protocol edges, where a request enters: HTTP (`/predict`, KServe v2) and KServe v2 over
gRPC. An edge decodes its bytes, hands the request to the core, and encodes what comes back;
it decides nothing about a request itself."""
