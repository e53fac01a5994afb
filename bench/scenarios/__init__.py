"""The scenario benchmark: labelled fault scenarios, run through real processes, scored.

Each scenario (``cases/*.yaml``, see ``spec.py`` for the format) names a fleet, a timeline of
injected events and the outcome an SRE expects. ``python -m bench.scenarios`` runs them and prints
a scorecard: pass/fail per scenario, quarantine precision and recall, false pages, missed faults,
and fault → action times.
"""
