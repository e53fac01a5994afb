"""Repairs: the remediation ladder, its executors, certification and return to service."""
