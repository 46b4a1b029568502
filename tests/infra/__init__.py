"""Real infrastructure for the tests (issue 10): servers started from Debian packages."""
