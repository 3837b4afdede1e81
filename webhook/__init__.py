"""webhook package."""
