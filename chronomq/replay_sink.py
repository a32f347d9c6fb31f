"""The broker as a Spark replay's sink: ``spark.jobs.replay`` sends through a
``ReplaySink``, and this one sends over the chronomq API's SendStream.

Each Spark task opens its own connection (the sink holds only the address and token, so
it pickles to the executors), encodes rows with the hand-written protobuf encoder of
``chronomq.api.wire`` (no message objects per row), and pipelines its requests on one
stream.  Results come back one per row, refusals as ``"CODE: message"``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from chronomq.api.wire import encode_outgoing, encode_send_request
from chronomq.client.client import ChronomqClient, status_by_number
from spark.jobs import Result, Row


@dataclass(frozen=True, slots=True)
class GrpcReplaySink:
    target: str  # host:port of the broker
    token: str = ""  # bearer token, when the broker requires one

    def send(self, batches: Iterator[list[Row]]) -> Iterator[list[Result]]:
        def requests() -> Iterator[bytes]:
            for batch in batches:
                yield encode_send_request([encode_outgoing(*row) for row in batch])

        with ChronomqClient(self.target, self.token) as client:
            for outcomes in client.send_stream_encoded(requests()):
                yield [(o.ok, o.duplicate,
                        "" if o.ok else f"{status_by_number(o.error_code).name}: {o.error}")
                       for o in outcomes]
