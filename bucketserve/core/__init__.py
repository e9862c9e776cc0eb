"""The request core, where a request is decided: the engine (the one call, `infer`, and the
lifecycle) resolves the model through the registry (what is served, by name and version),
admits through the model's scheduler (the length-bucket queues, the instances), and the model
runs each batch (collate -> run -> split, with `layout` and `bucketing`). Imports only the
shared modules (settings, logs, errors, metrics, tracing): no protocol, no load time and no
ONNX Runtime here."""
