"""The tier the configuration names: its provider, and the lease's own view of it.

Imported by the broker at open; boto3 only when the tier is S3 (it costs ~0.2 s of
every start, and most brokers never use it).
"""

from __future__ import annotations

from chronomq.config import BrokerConfig
from tiered.provider import Provider
from tiered.providers.local import LocalProvider
from tiered.providers.memory import MemoryProvider


def make_provider(config: BrokerConfig) -> Provider:
    """The tier the configuration names."""
    tier = config.tier
    if tier.provider == "s3":
        # imported here: boto3 costs ~0.2 s of every start, and most brokers never use it
        from tiered.providers.s3 import S3Provider, S3Settings
        return S3Provider(S3Settings(
            bucket=tier.s3_bucket, prefix=tier.s3_prefix, endpoint_url=tier.s3_endpoint_url,
            region=tier.s3_region, access_key_id=tier.s3_access_key_id,
            secret_access_key=tier.s3_secret_access_key,
            connect_timeout_s=tier.s3_connect_timeout_s, read_timeout_s=tier.s3_read_timeout_s,
            max_attempts=tier.s3_max_attempts))
    if tier.provider == "memory":
        return MemoryProvider()
    return LocalProvider(config.tier_local_dir())


def make_lease_provider(config: BrokerConfig, tier: Provider) -> Provider:
    """The tier as the lease uses it (``cluster.lease``): on S3 a client of its own whose
    every request is bounded by the lease (connecting and each wait ``tier.lease_s`` / 6,
    one attempt: the lease reads an unanswered write back itself, and renews again a
    third of a lease later), so a lease write and its read-back take at most 2/3 of a
    lease, whatever the ``tier.s3_*`` time-outs of the uploads; the same provider
    otherwise."""
    t = config.tier
    if t.provider != "s3":
        return tier
    from tiered.providers.s3 import S3Provider, S3Settings
    bound_s = t.lease_s / 6  # a write and its read-back, two waits each: 2/3 of a lease
    return S3Provider(S3Settings(
        bucket=t.s3_bucket, prefix=t.s3_prefix, endpoint_url=t.s3_endpoint_url,
        region=t.s3_region, access_key_id=t.s3_access_key_id,
        secret_access_key=t.s3_secret_access_key, connect_timeout_s=bound_s,
        read_timeout_s=bound_s, max_attempts=1, max_pool_connections=4))
