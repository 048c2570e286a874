"""Tests of kronos_audit.history: a run's log and bisecting two runs."""
