"""Running ``realtime serve`` as processes: one on its own (server_process.py), or several replicas
behind nginx on one machine (replicas.py, docs/deploy.md)."""
