"""Tests of kronos_audit._internal: the git command, run one way."""
