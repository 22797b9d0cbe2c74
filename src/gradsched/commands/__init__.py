"""Subcommands of the gradsched command line: one module each, with register(subparsers)."""
