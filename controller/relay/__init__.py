"""``vigil relay``: a process that holds agents' connections for the controller and carries their
streams to it on one (``protos/vigil/v1/relay.proto``). It keeps no state of its own beyond the
streams open now: restarted, its agents reconnect and resend what was not acknowledged."""
