"""The request core, where a request is decided: the engine (which model, admission through
its scheduler) -> scheduler (the length-bucket queues, the instances) -> model (collate -> run
-> split, with `layout` and `bucketing`). No protocol and no ONNX Runtime here."""
