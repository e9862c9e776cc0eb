"""ONNX Runtime: sessions, shared weights, buffer bindings and the three binding strategies.

No asyncio and no HTTP here; callers hand in collated feeds and get output arrays back.
Imports the core's bucket keys and layout (what it runs for) and the shared modules.
"""

from bucketserve.runtime.executors import Executor, make_executor

__all__ = ["Executor", "make_executor"]
