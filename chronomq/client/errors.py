"""The client side's error tree.

The client library (``chronomq.client``) talks to a broker over gRPC and imports nothing
of the server side (``store``, ``timer``, ``pop``, ``tiered``, the broker): its errors are
its own.  ``ClientError`` is their root; a broker's refusal arrives as ``RpcError`` with
the gRPC status the broker's one error edge (``chronomq.api.errors``) chose.
"""

from __future__ import annotations

import re

import grpc

# a topic held while a takeover adopts its state (the broker's ``store.holds``): its new
# owner answers it in a moment, so a call refused so is tried again soon, at the same
# broker, without the growing back-off of a broker that is away
BEING_TAKEN_OVER = re.compile(r"\bis being taken over from broker ")
HELD_RETRY_S = 0.1
# the longest pause between looks for a topic's owner that does not answer (down,
# restarting, or taken over and its successor not yet serving): a successor is found
# within this of its claim, at a few cheap lookups a second while the owner is away
FOLLOW_BACKOFF_S = 0.25


def being_taken_over(details: str) -> bool:
    """Whether an UNAVAILABLE says the topic is held by a takeover under way here."""
    return BEING_TAKEN_OVER.search(details) is not None


class ClientError(Exception):
    """Raised for any error the client library raises on purpose (the root of the tree)."""


class RpcError(ClientError):
    """Raised when the broker answers a call with an error status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
