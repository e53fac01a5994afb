"""Checks across nodes, and the fabric component a sweep blames."""
