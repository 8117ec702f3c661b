"""Pure functions from the settings to the stack's configuration: rules, runbooks' blocks,
shipper configurations, Kubernetes objects. No file is written here (sglang_obs.generate does)."""
