"""``chronomq.routing`` keeps working: the module is ``chronomq.client.routing``."""

from chronomq.client.routing import BrokerDirectory, RoutedClient

__all__ = ["BrokerDirectory", "RoutedClient"]
