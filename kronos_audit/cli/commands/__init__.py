"""The `kaudit` commands, one module per top-level command (``keys`` with its subcommands),
each imported only when its command runs or its help is asked for (the table is
:data:`kronos_audit.cli._app.COMMANDS`)."""
