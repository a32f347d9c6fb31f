"""``chronomq.producer`` keeps working: the module is ``chronomq.client.producer``."""

from chronomq.client.producer import BufferFull, Producer, ProducerClosed

__all__ = ["BufferFull", "Producer", "ProducerClosed"]
