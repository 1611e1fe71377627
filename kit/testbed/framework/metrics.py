"""Reading a Prometheus text page (``/metrics`` of kube-apiserver, of the webhooks): the samples of one metric."""

from __future__ import annotations

import re
from collections.abc import Iterator

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, metric: str) -> Iterator[tuple[dict[str, str], float]]:
    """Each sample of ``metric`` on the page: its labels and its value."""
    for line in text.splitlines():
        if not line.startswith(metric) or line[len(metric) : len(metric) + 1] not in ("{", " "):
            continue
        labels = dict(_LABEL.findall(line[line.index("{") + 1 : line.rindex("}")])) if "{" in line else {}
        yield labels, float(line.rsplit(" ", 1)[1])


def total(text: str, metric: str, **labels: str) -> float:
    """The sum of the samples of ``metric`` whose labels include ``labels``."""
    return sum(value for found, value in samples(text, metric) if all(found.get(k) == v for k, v in labels.items()))
