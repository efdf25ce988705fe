"""A run: the round loop on the client, one partition's round on a worker, the servers and
population it needs.
"""
