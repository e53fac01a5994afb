"""Vigil plan's math: checkpoint intervals, ETTR, the Monte Carlo of whole runs."""
