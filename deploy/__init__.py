"""Running several replicas behind nginx on one machine (docs/deploy.md)."""
