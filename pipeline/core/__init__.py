"""The base layer: errors, atomic writes, bounded reads of files, the event loop, home,
tables, memory and seeds. Its modules import nothing of simpipe but each other."""
