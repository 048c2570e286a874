"""Tests of kronos_audit.statement: manifests, predicates and the schemas shipped."""
