"""Training jobs: their reports, MFU, goodput, saves and restarts."""
