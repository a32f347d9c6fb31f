"""The one test kit that ``tests/`` and ``bench/`` both import (docs/DESIGN.md,
"Packages"): the client ledger (``ledger``) and its one checker (``checker``, with the
failover chaos's load rules in ``promises``), broker processes (``process``), SeaweedFS
and moto S3 servers (``seaweed``, ``s3``), the fault proxy in front of S3 (``proxy``),
waiting on the real clock (``wait``), and the failover chaos harness (``chaos``).
Nothing under ``chronomq/`` or the other server packages imports it; it is not
installed (tests and benchmarks run from the repository's root)."""
