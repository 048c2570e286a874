"""Checkpoint files: HDF5 format, content hashing, atomic and asynchronous writing."""
