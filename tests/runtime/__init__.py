"""Runtime tests (kronos_audit.runtime)."""
