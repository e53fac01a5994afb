"""Vigil's actuator for clusters scheduled by Slurm: drains and resumes through slurmctld."""
