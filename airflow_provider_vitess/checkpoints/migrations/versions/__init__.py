"""Versioned schema migrations of the checkpoint store (one module per revision)."""
