"""Code the tests share that is not a test: reference implementations, browsers, clients."""
