"""POP consumption: leases (PopCheckpoints), receipt handles, ack."""
