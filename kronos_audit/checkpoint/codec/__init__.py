"""The state codec: a program's state (numpy, torch, JAX, Python values, containers,
objects with ``state_dict()``) as flat HDF5 datasets plus ``/kaudit/tree``, the record of
its structure and types, and back; and the fitting of a read state into a template.

``tree`` holds the entry points (encode, decode, fit, state_digest); ``registry`` the
node kinds and the table of handlers; ``walk`` the three walks; ``containers``,
``numpy``, ``torch`` and ``jax`` one handler module each.
"""
