"""Tests of kronos_audit.provenance: the environment lock and the git state."""
