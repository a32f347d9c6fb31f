"""``TierConfig``: the ``[tier]`` settings, one frozen dataclass for the tier's provider,
the upload of topic queues (``tiered.dispatcher``), reads, retention, the key index,
mounts and topic ownership.

It lives with the tier so that ``tiered`` takes its own settings without a copy; the
broker's configuration (``chronomq.config``) holds it as its ``tier`` section, and the
TOML keys are its field names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TierConfig:
    provider: str = "local"  # "local" (a directory), "s3", or "memory" (tests only)
    local_dir: str = ""  # default: <store.data_dir>/../chronomq-tier
    broker_name: str = "broker-0"  # the tier layout is keyed by it
    s3_bucket: str = ""
    s3_prefix: str = ""
    s3_endpoint_url: str = ""
    s3_region: str = "us-east-1"
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""
    s3_connect_timeout_s: float = 5.0  # every S3 request: to open a connection ...
    s3_read_timeout_s: float = 10.0  # ... each wait for an answer's bytes ...
    s3_max_attempts: int = 3  # ... and attempts in all (the first included)
    upload: bool = False  # copy every topic queue to the tier (the tiered message store)
    upload_batch_bytes: int = 4 << 20  # a queue's buffer goes up at this size ...
    upload_batch_ms: int = 5000  # ... or this age
    upload_buffer_bytes: int = 64 << 20  # all queues' buffers together: beyond it, all go up
    segment_bytes: int = 256 << 20  # tier segment size
    upload_timeout_s: float = 30.0  # a slower upload switches segment and retries
    segment_ms: int = 3_600_000  # a tier segment also closes after this span of data
    read: str = "not_in_disk"  # when Pop reads the tier: disable | not_in_disk |
    #                            not_in_mem | force (tiered/reader.py)
    hot_bytes: int = 1 << 30  # not_in_mem: the newest bytes of the CommitLog read locally
    read_ahead_bytes: int = 64 << 20  # the read-ahead cache's bound (0: no cache)
    read_ahead_ttl_ms: int = 10_000  # cached entries unread this long are dropped
    retention_ms: int = 0  # keep data in the tier this long (0: forever); per topic:
    #                        the topic's tier_retention_ms
    fold_objects: int = 32  # this many small tier objects of a queue are folded into
    #                         one (tiered/fold.py; 0: never): its metadata stays small
    fold_keep_s: float = 3600.0  # the folded objects are deleted this long after
    index_entries: int = 1 << 20  # a tier key-index file is sealed at this many entries
    index_ms: int = 300_000  # ... or this age
    mounts: str = ""  # broker names (comma-separated) whose tiers this broker serves
    #                   read-only (tiered/mount.py), e.g. a departed broker's
    claim_topics: bool = False  # record each topic's owner in the shared tier
    #                             (cluster/ownership.py): for several brokers on one bucket
    durable_ack: bool = False  # answer OK only once the change is in the tier (needs
    #                            upload): what a broker acknowledged outlives its machine
    durable_ack_ms: int = 50  # durable-ack: the longest a change waits for its upload
    #                           to start; only under load (tiered.durable.Linger), else
    #                           commits run back to back
    takeover: str = ""  # a departed broker's name: take over its topics at start
    #                     (cluster/takeover.py)
    failover: bool = False  # hold a lease in the bucket (brokers/<name>.json), take over
    #                         brokers whose lease expired, fence this one when its own
    #                         cannot be renewed (cluster/lease.py)
    lease_s: float = 10.0  # a lease's length; renewed every lease_s / 3
    start_timeout_s: float = 60.0  # at start, the lease and the first tier requests are
    #                                retried with back-off this long before giving up
    rejoin_timeout_s: float = 600.0  # a broker taken over, started again: how long it
    #                                  waits for the takeover of its old incarnation
    #                                  (cluster/rejoin.py)
    journal_snapshot_records: int = 100_000  # a snapshot of the groups' state in the
    #                                          journal after this many records (0: only
    #                                          at start): what a takeover replays
    journal_snapshot_s: float = 5.0  # ... or after this long, once as many records came
    #                                  as the last snapshot had (0: by records only), the
    #                                  timer's too (cluster.timersnapshot): a takeover
    #                                  reads about this long of small objects
