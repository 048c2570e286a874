"""Checkpoint files: the flat HDF5 layout, the state codec, content hashing, atomic and
asynchronous writing."""
