"""``python -m kronos_audit``: the `kaudit` command line."""

from kronos_audit.cli import main

if __name__ == "__main__":
    main()
