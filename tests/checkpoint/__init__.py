"""Checkpoint tests."""
