"""Coordination of brokers on one bucket: leases, topic ownership, the bucket's layout of
coordination objects, and the replay of a departed broker's journal."""
