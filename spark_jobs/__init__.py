"""Spark jobs submitted by the provider's operators (each file is its own spark-submit entry point)."""
