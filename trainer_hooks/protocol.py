"""What a training job and whoever launches it agree on, without importing torch."""

from __future__ import annotations

# The job checkpointed on request (SIGTERM, or the controller's CHECKPOINT_AND_RESTART): start it
# again. 75 is EX_TEMPFAIL; a Kubernetes Job's pod failure policy matches it (``deploy/``).
CHECKPOINTED_EXIT_CODE = 75
