"""The ``apache.rocketmq.v2`` message and service classes, from the ``rocketmq-python-client``
package (``rocketmq.grpc_protocol``).

Importing ``rocketmq.grpc_protocol`` the ordinary way runs the client package's
``__init__``, which loads the whole client (OpenTelemetry included) and configures a log
file under ``~/logs``.  The server needs only the generated modules, so they are loaded
below a placeholder ``rocketmq`` package that is dropped again afterwards: a later
``import rocketmq`` (a client in the same process, as in the tests) gets the real package
and reuses the modules loaded here.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


def _load() -> tuple[Any, Any, Any]:
    names = ("definition_pb2", "service_pb2", "service_pb2_grpc")
    if "rocketmq" in sys.modules:
        return tuple(importlib.import_module(f"rocketmq.grpc_protocol.{n}")  # type: ignore[return-value]
                     for n in names)
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("the RocketMQ 5 front needs the rocketmq extra: "
                          "pip install 'chronomq[rocketmq]'")  # chronomq.extras
    placeholder = types.ModuleType("rocketmq")
    placeholder.__path__ = list(spec.submodule_search_locations)
    sys.modules["rocketmq"] = placeholder
    try:
        return tuple(importlib.import_module(f"rocketmq.grpc_protocol.{n}")  # type: ignore[return-value]
                     for n in names)
    finally:
        del sys.modules["rocketmq"]


definition, service, service_grpc = _load()
