"""Slurm-aware machine health of opted-in pools (docs/scaling.md, "Slurm-aware machine health").

- :mod:`.config`: the per-mapping opt-in (``slurmHealth``) as a validated object;
- :mod:`.judge`: never registered, lost, or working: pure judgments of one Machine;
- :mod:`.service`: :class:`~.service.MachineHealth`, which reports (condition, Event, metric) and
  remediates (delete, for the MachineSet to replace) within ``maxUnhealthy``.
"""
