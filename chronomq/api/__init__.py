"""The gRPC API ``chronomq.v1.Broker``: the servicer (one method per RPC), the Subscribe
stream's state, the method handlers that check credentials and malformed requests and map
project errors to status codes once (``errors``), the call budget, long-poll
notifications, the Stats figures and the hand-written wire codec of the hot messages."""
