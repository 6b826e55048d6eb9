"""Model architectures (built by issue 3)."""
