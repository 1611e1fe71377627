"""The timeline of one scale-up, from job submission to job start, as the thesis measures it (section 6.3.2).

A :class:`ScaleUp` holds the wall-clock time of each step the loop goes through (:data:`STEPS`),
as the whole-loop tier observes them; :data:`PHASES` groups them as the thesis' Figure 6.15
does (KEDA reaction, scaling webhook, node provisioning) with the Cluster API and Slurm steps
between made visible. :func:`render` prints the table, :func:`plot` draws it as a PNG (the
thesis' two views: the whole scale-up, and zoomed around the admission). Pure, except :func:`plot`,
which writes a file (matplotlib, from the ``real`` extra).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# (key, what happened): the order the loop must go through them.
STEPS: tuple[tuple[str, str], ...] = (
    ("submitted", "job submitted (sbatch)"),
    ("seen", "demand seen by the scaler's source (Prometheus or /demand)"),
    ("admitted", "scaling webhook admitted KEDA/HPA's /scale of the mirror"),
    ("mirror", "mirror stored at the new replicas"),
    ("md", "MachineDeployment set by the scaling leader"),
    ("machine", "Machine created by Cluster API"),
    ("injected", "metaData Secret stored with the join data (injection webhook)"),
    ("registered", "slurmd registered with slurmctld"),
    ("started", "job started"),
)
STEP_KEYS = tuple(key for key, _ in STEPS)
# (name, from step, to step): the thesis' three phases, with Cluster API and Slurm's own steps apart.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("KEDA reaction", "submitted", "admitted"),
    ("scaling webhook", "admitted", "md"),
    ("Cluster API", "md", "machine"),
    ("provisioning (Metal3, cloud-init)", "machine", "registered"),
    ("Slurm scheduling", "registered", "started"),
)


@dataclass
class ScaleUp:
    """One scale-up: ``label`` (e.g. "4-node job"), and the wall-clock second of each step seen."""

    label: str
    at: dict[str, float] = field(default_factory=dict)
    # The scaling webhook's own API requests from the mirror stored to its MachineDeployment write:
    # (seconds after the mirror was stored, "VERB resource/subresource"), what the webhook phase is made of.
    leader_calls: list[tuple[float, str]] = field(default_factory=list)
    # For a step found by polling: the time of the poll before, which had not found it yet. The
    # step happened after that, so it is out of order only if a later step precedes that time.
    not_before: dict[str, float] = field(default_factory=dict)

    def mark(self, step: str, when: float, not_before: float | None = None) -> None:
        """Record ``step`` at ``when`` (the first time only: later sightings of the same step are not it).

        ``not_before``: for a polled step, when the previous poll (which did not see it) was made."""
        if step not in STEP_KEYS:
            raise ValueError(f"unknown step {step!r}; steps: {', '.join(STEP_KEYS)}")
        if step not in self.at:
            self.at[step] = when
            if not_before is not None:
                self.not_before[step] = not_before

    def missing(self) -> list[str]:
        return [key for key in STEP_KEYS if key not in self.at]

    def out_of_order(self) -> list[tuple[str, str]]:
        """Consecutive seen steps whose times run backwards: (earlier step, later step)."""
        seen = [key for key in STEP_KEYS if key in self.at]
        return [(a, b) for a, b in zip(seen, seen[1:], strict=False) if self.at[b] < self.not_before.get(a, self.at[a])]

    def since_submit(self, step: str) -> float | None:
        if step not in self.at or "submitted" not in self.at:
            return None
        return self.at[step] - self.at["submitted"]

    def phases(self) -> list[tuple[str, float | None]]:
        """Each phase's duration in seconds (None when one of its ends was not seen)."""
        return [
            (name, self.at[end] - self.at[start] if start in self.at and end in self.at else None)
            for name, start, end in PHASES
        ]


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def render(scale_ups: Sequence[ScaleUp]) -> str:
    """The timeline as text: each step's time since submission, then the phases."""
    lines = []
    for scale_up in scale_ups:
        lines.append(f"Scale-up: {scale_up.label}")
        for key, what in STEPS:
            lines.append(f"  {_seconds(scale_up.since_submit(key)):>10}  {what}")
        lines.append("  phases: " + ", ".join(f"{name} {_seconds(seconds)}" for name, seconds in scale_up.phases()))
        problems = [f"{a} after {b}" for a, b in scale_up.out_of_order()] + [
            f"{key} not seen" for key in scale_up.missing()
        ]
        if problems:
            lines.append("  NOT IN ORDER: " + "; ".join(problems))
    return "\n".join(lines)


def plot(scale_ups: Sequence[ScaleUp], path: Path, title: str = "SliMe scale-up, job submitted to job started") -> Path:
    """Draw the phases of each scale-up as bars and write a PNG: the whole scale-up above (the thesis'
    Figure 6.15), and below, each scale-up shifted so its admission is at 0 and zoomed to the scaling
    webhook's phase and the start of Cluster API's (Figure 6.16's view)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write files only
    import matplotlib.pyplot as plt

    figure, (whole, zoomed) = plt.subplots(2, 1, figsize=(12, 2.2 + 1.1 * len(scale_ups) * 2))
    colours = ("#4e79a7", "#f28e2b", "#59a14f", "#9c755f", "#e15759")
    for axis, around_admission in ((whole, False), (zoomed, True)):
        for row, scale_up in enumerate(scale_ups):
            shift = (scale_up.since_submit("admitted") or 0.0) if around_admission else 0.0
            for (name, start, end), colour in zip(PHASES, colours, strict=True):
                left, right = scale_up.since_submit(start), scale_up.since_submit(end)
                if left is None or right is None:
                    continue
                axis.barh(
                    row, max(right - left, 1e-4), left=left - shift, color=colour, label=name if row == 0 else None
                )
        axis.set_yticks(range(len(scale_ups)), [s.label for s in scale_ups])
        axis.invert_yaxis()
        if around_admission:
            axis.set_xlim(*_admission_window(scale_ups))
            axis.set_xlabel("seconds since the scaling webhook admitted the mirror's /scale")
            axis.set_title(
                "zoomed around the admission: the scaling webhook and the leader's MachineDeployment write", fontsize=9
            )
        else:
            axis.set_xlabel("seconds since the job was submitted")
            axis.set_title(title, fontsize=10)
            axis.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)  # beside the bars, never over them
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _admission_window(scale_ups: Iterable[ScaleUp]) -> tuple[float, float]:
    """From a little before the admission to three times the longest scaling-webhook phase after it."""
    spans = [t for s in scale_ups if (t := dict(s.phases()).get("scaling webhook")) is not None]
    longest = max(spans, default=0.1)
    return (-longest, longest * 3)
