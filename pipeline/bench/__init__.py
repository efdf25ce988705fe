"""``simpipe bench``: each benchmark prints one table."""
