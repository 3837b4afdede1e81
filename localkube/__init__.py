"""localkube package."""
