"""The client side's error tree.

The client library (``chronomq.client``) talks to a broker over gRPC and imports nothing
of the server side (``store``, ``timer``, ``pop``, ``tiered``, the broker): its errors are
its own.  ``ClientError`` is their root; a broker's refusal arrives as ``RpcError`` with
the gRPC status the broker's one error edge (``chronomq.api.errors``) chose.
"""

from __future__ import annotations

import grpc


class ClientError(Exception):
    """Raised for any error the client library raises on purpose (the root of the tree)."""


class RpcError(ClientError):
    """Raised when the broker answers a call with an error status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
