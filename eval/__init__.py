"""eval package (see README)."""
