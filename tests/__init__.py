"""The test suite: a package, so its helpers are imported as `tests.helpers` (not from conftest)."""
