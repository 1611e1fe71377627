"""Slurm-aware scale-in of opted-in MachineDeployments (docs/scaling.md, "Safe scale-in").

- :mod:`.config`: the per-mapping opt-in (``safeScaleIn``) as a validated object;
- :mod:`.victims`: which Machines a scale-down may remove, in which order (pure);
- :mod:`.service`: :class:`~.service.SafeScaleIn`, the one place that drains, marks, releases.

Slurm itself (the client, how a Machine relates to its node) is :mod:`scaling_webhook.slurm`.
"""
