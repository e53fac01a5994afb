"""Vigil: GPU-cluster health checking and fault tolerance.

This package holds what every part shares: the domain types (plain dataclasses, converted to
protobuf only at the edges), logging set-up, and the ``vigil`` command line.
"""

__version__ = "0.1.0"
