"""The words every room shares: the policy, a node's state, the actions."""
