"""Tests of kronos_audit.keys: Ed25519 keys, trust stores and DSSE envelopes."""
