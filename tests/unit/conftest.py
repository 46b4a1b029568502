"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def catalogue():
    """The embedded server's perturbation and attack catalogue, as plan validation reads it."""
    from fortis.server.app.stack import local_catalogue

    return local_catalogue()
