"""Tests of kronos_audit.verification: signature, digests, dataset hashes, the chain."""
