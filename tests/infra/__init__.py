"""Real infrastructure for the tests: servers started from Debian packages."""
