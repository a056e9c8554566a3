"""One module per ``racktwin`` command (see agent/cli.py)."""
