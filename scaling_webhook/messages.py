"""Refusals the scaling webhook and the chart word alike (the chart fails ``helm template`` with the same text).

``tests/chart/test_mapping_messages.py`` renders the chart on the same input and compares.
"""

from __future__ import annotations

from typing import Final

# Replicas are int32 in Kubernetes (autoscaling/v1 Scale, CAPI MachineDeployment).
MAX_INT32: Final = 2**31 - 1

# A mapping with no maxReplicas whose pool nothing else caps (capacityAware caps it at the hosts).
# Format with where="mappings[<i>]" and mirror="<namespace>/<name>".
UNCAPPED_MAPPING: Final = (
    "{where} (mirror {mirror}): maxReplicas is required unless capacityAware caps the pool: a mirror anyone can "
    "scale would otherwise ask for up to " + str(MAX_INT32) + " Machines"
)


def uncapped_mapping(where: str, mirror: str) -> str:
    """The refusal of an uncapped mapping, e.g. ``uncapped_mapping("mappings[0]", "slime-system/mirror-a")``."""
    return UNCAPPED_MAPPING.format(where=where, mirror=mirror)
