"""Coordination tests: leases, ownership, the layout of the bucket."""
