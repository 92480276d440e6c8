"""The e2e server fixtures, for the clients run against a real server."""

from tests.e2e.conftest import tiny_server  # noqa: F401
