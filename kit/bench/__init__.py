"""SliMe benchmark: ``python3 -m bench`` (see ``bench/run.py`` and ``docs/performance.md``)."""
