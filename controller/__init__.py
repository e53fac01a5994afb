"""The controller: receive → decide → guard → act → recover.

- receive: ``agent_gateway`` (agents' streams), ``trainer_gateway`` (training jobs' reports),
  ``admin`` (the ``vigil`` commands); ``engine`` takes each batch and owns the ``fleet`` (nodes in
  memory; the job monitor and the sweeper read it through ``FleetView``).
- decide: ``decide`` (pure), with ``policy``, ``node_state`` and the vocabulary in ``actions``;
  a job's MFU in ``mfu`` and ``jobs`` (``job_state``: its phases), sweeps in ``sweep_spec`` and
  ``sweep_judge``.
- guard: ``guard`` (dry-run, circuit breaker, rate limit), its pure rules in ``guard_rules``.
- act: ``apply`` (what each action means: recorded, followed, executed), ``action_runner``
  (retries, acks), ``actuators`` / ``local_actuator`` / ``kube`` and ``pagers``; ``store`` (SQLite,
  by domain) holds it all durably.
- recover: ``recovery`` (pure rules) and ``release_checks``; ``sweep``, ``pairing``, ``fabric`` and
  ``topology`` run checks and localise a slow node, link or fabric component.
- plan: ``plan`` (with ``plan_model``, ``plan_faults``, ``plan_sim``) does the math behind ``vigil plan``.
"""
