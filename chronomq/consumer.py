"""``chronomq.consumer`` keeps working: the module is ``chronomq.client.consumer``."""

from chronomq.client.consumer import Consumer

__all__ = ["Consumer"]
