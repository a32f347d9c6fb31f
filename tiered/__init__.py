"""Tiered storage: the storage Provider protocol and its implementations (memory, local
directory, S3).  Buffering, commit positions and retries live above the providers."""
