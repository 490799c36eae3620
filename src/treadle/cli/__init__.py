"""Command-line interface; the composition root that builds settings, store and processes."""
