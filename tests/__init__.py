"""The test suite: a regular package, so `tests.*` is always this one (xdsl, from the convert extra, and
some client libraries install a top-level `tests` of their own into site-packages)."""
