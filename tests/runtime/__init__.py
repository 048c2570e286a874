"""Runtime tests: a package, so that test_retention.py here and tests/test_retention.py
are two modules."""
