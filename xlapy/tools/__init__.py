"""Command-line tools (nothing imports this package)."""
