"""The node's GPUs as Vigil reads them: the backend interface (``backend``), NVML (``nvml_backend``),
a simulated backend with fault injection for the demo and the tests (``simulated``), and the rules
that call a reading unhealthy (``health``). Used by the agent's collectors and by the ``gpu_health``
check, which is why it sits below both.
"""
