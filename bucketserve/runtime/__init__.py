"""ONNX Runtime: sessions, shared weights, buffer bindings and the three binding strategies.

No asyncio and no HTTP here; callers hand in collated feeds and get output arrays back.
"""

from bucketserve.runtime.executors import Executor, make_executor

__all__ = ["Executor", "make_executor"]
