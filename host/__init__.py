"""The host model and the ``ndpim`` command line."""
