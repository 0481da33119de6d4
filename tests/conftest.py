"""Test settings: hypothesis runs derandomized, so every run draws the same examples."""

from hypothesis import settings

settings.register_profile("rlflow", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("rlflow")
