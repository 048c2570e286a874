"""Tests of kronos_audit.signing: signing known digests, and snapshot."""
