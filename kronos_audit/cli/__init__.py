"""The `kaudit` command line: parse, call the library, render with rich, exit 0/1/2."""

from kronos_audit.cli import bisect, diff, interval, manifests, replay, storage, supervise  # noqa: F401  (registers its commands)
from kronos_audit.cli._app import cli


def main() -> None:
    cli(prog_name="kaudit")


__all__ = ["cli", "main"]
