"""Real upstream components for the tiers that need them, built or fetched on first use and cached.

Nothing here is a stand-in: each module builds (from the Go module proxy or Debian's packages,
at pinned versions) and runs the real program, on 127.0.0.1 or in network namespaces it creates
and removes. A missing prerequisite is a one-line skip reason locally and a failure under
``CI=true`` (:func:`testbed.real.prerequisites.unavailable`).
"""
