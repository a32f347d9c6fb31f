"""Delayed delivery: a RocksDB timer store for what is due within hours and an in-memory
hierarchical wheel for the next seconds."""
