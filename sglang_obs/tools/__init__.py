"""What an operator runs: the native stack, the alert sink, snapshots, log analysis."""
