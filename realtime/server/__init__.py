"""The HTTP server around the endpoints: app, uvicorn set-up, CLI, config, limits, admin, metrics."""
