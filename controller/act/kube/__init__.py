"""Vigil's Kubernetes side: the actuator that quarantines nodes, the Lease leader election, and the
review of agents' service-account tokens.

The only package that imports ``kubernetes`` (a layering contract in pyproject.toml checks it).
"""
