"""The linear public goods game: its environment, the ``Game``, its words, its rule-based
players and its reference data.
"""
