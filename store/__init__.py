"""Local durable store: the CommitLog (the one write path) and the views built from it."""
