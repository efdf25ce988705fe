"""The p-beauty contest: its environment, the ``Game``, its words, its rule-based players and
its reference data.
"""
