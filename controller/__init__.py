"""The controller, in rooms stacked by an import-linter contract (pyproject.toml): each imports only
the rooms below its own.

- ``daemon``: serves gRPC and /metrics, leader election; ``compose``: the composition root (builds
  every room and wires them); ``config``: the configuration file, composing each room's settings.
- ``edge/``: where the wire ends: the agent and trainer gateways, the admin service, who may call
  what (``authz``), undecodable bytes refused; ``limits`` (what one client may send).
- ``jobs/``: training jobs: the job monitor (``monitor``: reports), an MFU drop judged (``drops``),
  commands and the recovery sweep (``restarts``), a job's phases (``state``), MFU, goodput, saves on
  early warnings; ``settings``.
- ``repairs/`` (beside ``jobs/``): the remediation ladder (``ladder``) and a repair's way up it
  (``repair``), pages only when hands are needed (``pages``), all pure; the reboot executors
  (``reboot``), the remediation settings (``config``), and ``repairs``, the shell: steps, certification,
  release.
- ``sweeps/``: checks across nodes: what runs (``spec``), how it is judged (``judge``), pairing and
  the topology-aware fabric blame; ``sweeper`` the shell.
- ``nodes/``: a node's fault from decision to action: the ``engine`` (each batch, and ``found``: what
  the controller found itself, its outcome as data), the in-memory ``fleet``, the pure ``decide``,
  application faults, ``guards/`` (dry-run, the breaker, failure domains), ``actions/`` (what each
  action means, the runner, what follows an action, fold reports), ``recovery/`` (when a node goes
  back, its release checks), the periodic ``upkeep``, a new leader's ``adopt``, what people ask by
  hand (``by_hand``).
- ``act/``: the world acted on: ``actuators``, the ``local_actuator``, ``kube/`` (the only code that
  imports ``kubernetes``), ``pagers/``, agents' tokens.
- ``store/``: durable state by domain over SQLite or PostgreSQL.
- ``vocab/`` (the policy, a node's state, the actions), ``metrics``, ``planning/`` (``vigil plan``'s
  math): the ground floor.
"""
