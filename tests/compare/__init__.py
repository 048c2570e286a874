"""Tests of kronos_audit.compare: verdicts, tolerances, plans, and agreement with h5diff."""
