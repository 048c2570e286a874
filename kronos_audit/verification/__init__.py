"""Verification: the trust model's steps in order (docs/security.md, "The steps of a
verification"): signature, place, fetch, content, chain; and replay attestations.

``results`` (what a verification yields: checks with a status), ``steps`` (the trust
decisions, no I/O), ``chain`` (the manifests read beside the one verified: signatures,
siblings, retention, parents), ``verifier`` (the I/O driver: reading, fetching from DVC,
hashing), ``attestation`` (replay attestations), ``batch`` (many at once, as the CLI names
them).
"""
