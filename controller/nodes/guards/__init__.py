"""The guardrails: dry-run, the circuit breaker and the failure-domain guard (rules pure, the guard the shell)."""
