"""Vigil's Kubernetes side: the actuator that quarantines nodes and the Lease leader election.

The only package that imports ``kubernetes`` (a layering contract in pyproject.toml checks it).
"""
