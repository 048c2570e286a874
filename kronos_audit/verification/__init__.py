"""Verifying a manifest, in the trust model's order (``docs/security.md``): the signature,
by a key the verifier's anchors accept; the manifest's place; the checkpoint's content;
the parent chain. Nothing is fetched or hashed before the signature and the place hold."""
