"""chronomq's composition root: configuration, gRPC services, server, CLI and client."""

__version__ = "0.1.0"
