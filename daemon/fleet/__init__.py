"""`edgepilot fleet`: the fleet seen from the broker alone (list, command, top, rollout)."""
