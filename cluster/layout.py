"""Where brokers sharing one bucket keep the objects they coordinate by: one place for
every such path, so the layout of the bucket reads here whole.

=================================  ==============================  =========================
object                             written by                      read by
=================================  ==============================  =========================
``brokers/<broker>.json``          its broker (conditional puts);  the lease watch, a
                                   a successor's claim             takeover, clients
                                   (``taken_by``)                  following a chain; a
                                                                   mount (the queue
                                                                   metadata it carries,
                                                                   ``tiered.carried``)
``owners/<topic>.json``            the topic's owner (created      clients and brokers
                                   with ``If-None-Match``)         looking an owner up
``takeovers/<departed>.json``      the broker taking it over       people; a rejoin of
                                                                   ``<departed>`` (done)
``<broker>/topics.json``           its broker (topic catalogue)    a takeover; a start
                                                                   (``cluster.rejoin``)
``<broker>/takeovers/<d>.json``    a broker that took ``d`` over   a takeover of it (the
                                                                   chain of older tiers)
``<broker>/pop-secret``            its broker at start             its successor (receipt
                                                                   handles)
``<broker>/index/recent-ids``      the first broker that indexed   the later brokers of its
                                   its last minute after it was    chain (``tiered.
                                   taken over                      recentids``)
``access/users.json``              any broker (conditional puts)   every broker, each second
                                                                   (``access.backends``)
=================================  ==============================  =========================

``<broker>`` is a broker's *tier prefix*, ``broker_prefix(tier.broker_name, incarnation)``:
the name itself for incarnation 0 (every bucket written before incarnations), then
``<name>--<n>``.  A broker restarted after it was taken over serves again under its name
as a new incarnation (``cluster.rejoin``), under a prefix of its own: its old
incarnation's objects stay as they were, read by its successor and the successor's
successors (``cluster.lineage``).  The lease, the owner records, ``taken_by`` and every
takeover name the prefix; ``tier.broker_name`` alone is the name people and clients
know.

The data a broker uploads lives under its prefix too (``<broker>/meta/``, ``/data/``,
``/index/``, ``/timer/``, ``/state/snapshot.json``): the tier's own layout
(``tiered.dispatcher``, ``store.journal``).  The JSON codecs of the lease and the owner
records are next to their code (``cluster.lease``, ``cluster.ownership``).
"""

from __future__ import annotations

from store.names import INCARNATION_SEP
from tiered.carried import LEASES as LEASES  # (re-exported: one place for paths)
from tiered.carried import lease_path as lease_path

OWNERS = "owners/"
TAKEOVERS = "takeovers/"


def broker_prefix(name: str, incarnation: int) -> str:
    """The tier prefix (and lease, and owner-record name) of incarnation ``incarnation``
    of the broker called ``name``: ``name`` for 0, ``<name>--<incarnation>`` after."""
    return name if incarnation == 0 else f"{name}{INCARNATION_SEP}{incarnation}"


def owner_path(topic: str) -> str:
    return f"{OWNERS}{topic}.json"


def takeover_record(departed: str) -> str:
    return f"{TAKEOVERS}{departed}.json"


def catalogue_path(broker: str) -> str:
    return f"{broker}/topics.json"


def chain_prefix(broker: str) -> str:
    return f"{broker}/takeovers/"


def chain_path(broker: str, departed: str) -> str:
    return f"{chain_prefix(broker)}{departed}.json"


def secret_path(broker: str) -> str:
    return f"{broker}/pop-secret"
