"""A quarantined node back into service: the rules (pure) and the release checks its agent runs."""
