"""Diagnostic checks: each runnable alone (``python -m checks.<name>`` or ``vigil check NAME``) and
each answering OK, FAIL or UNKNOWN with figures and a reason; never OK after a crash or timeout.

The workloads (matmul burn, memory bandwidth, all-reduce) need torch and run as subprocesses of
the agent or of ``vigil check``, so the resident agent never loads torch.
"""
