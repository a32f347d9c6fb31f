"""The client library imports nothing of the server side: an application that only sends
and consumes needs ``chronomq.client``, grpcio and protobuf, not RocksDB, boto3 or Spark."""

from __future__ import annotations

import json
import subprocess
import sys

SERVER_SIDE = ("store", "timer", "pop", "tiered", "spark", "access", "rocksdict", "boto3",
               "pyspark",
               "chronomq.broker", "chronomq.api", "chronomq.rocketmq", "chronomq.console",
               "chronomq.server")

PROBE = """
import json, sys
import chronomq.client, chronomq.client.producer, chronomq.client.consumer
import chronomq.client.routing
import chronomq.producer, chronomq.consumer, chronomq.routing  # the public paths of old
print(json.dumps(sorted(sys.modules)))
"""


def test_the_client_side_imports_no_server_module() -> None:
    # Given a fresh interpreter, When it imports every client module (new and old paths)
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True,
                         text=True, timeout=60)
    loaded = json.loads(out.stdout)
    # Then no server-side package or module is among what got loaded
    server = [m for m in loaded
              if any(m == s or m.startswith(s + ".") for s in SERVER_SIDE)]
    assert server == []
    assert "chronomq.client.client" in loaded


def test_the_old_public_paths_name_the_same_objects() -> None:
    from chronomq import consumer, producer, routing
    from chronomq.client import ChronomqClient, client
    from chronomq.client import consumer as c2
    from chronomq.client import producer as p2
    from chronomq.client import routing as r2

    assert ChronomqClient is client.ChronomqClient
    assert producer.Producer is p2.Producer and consumer.Consumer is c2.Consumer
    assert routing.RoutedClient is r2.RoutedClient
