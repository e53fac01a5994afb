"""The world acted on: Kubernetes, the local actuator, the pagers, agents' tokens."""
