"""train package (see README)."""
