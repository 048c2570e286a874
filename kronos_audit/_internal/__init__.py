"""Plumbing shared by the public modules; not part of the API."""
