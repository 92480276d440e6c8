"""The WebSocket endpoints: one per session kind (world.v1, tts.v1, OpenPI), on one lifecycle."""
