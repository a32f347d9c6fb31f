"""The Python client library: ``ChronomqClient`` (every RPC), ``Producer`` (futures, one
message at a time at stream speed), ``Consumer`` (an iterator over a Subscribe stream),
``RoutedClient`` (several brokers, each topic at its owner).

It imports nothing of the server side (a test checks it), so an application needs only
this package, grpcio and protobuf.  ``from chronomq.client import ChronomqClient`` keeps
working as before; so do ``chronomq.producer``, ``chronomq.consumer`` and
``chronomq.routing``.
"""

from chronomq.client.client import (
    ChronomqClient,
    RpcError,
    SendOutcome,
    Subscription,
    TimerResult,
    message,
    status_by_number,
)
from chronomq.client.errors import ClientError

__all__ = ["ChronomqClient", "ClientError", "RpcError", "SendOutcome", "Subscription",
           "TimerResult", "message", "status_by_number"]
