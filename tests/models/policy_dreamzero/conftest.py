"""The tiny DreamZero checkpoint, written once per test session."""

from __future__ import annotations

import pytest

from models.policy.dreamzero.checkpoint import load_checkpoint
from models.policy.dreamzero.tiny_checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("dreamzero") / "tiny")


@pytest.fixture(scope="session")
def tiny(tiny_folder):
    return load_checkpoint(tiny_folder)
