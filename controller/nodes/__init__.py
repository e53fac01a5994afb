"""A node's fault from decision to action: the engine, the fleet, the guards, recovery."""
