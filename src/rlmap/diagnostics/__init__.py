"""Diagnostics: the map's failure symptoms read from a run's records (``rlmap diagnose``)."""
