"""Settings of the injection webhook (flags and ``SLIME_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field, field_validator

from common.meta import label_selector_problem
from common.names import CAPM3_MANAGER_USERNAME
from common.settings import ServiceSettings
from injection_webhook.bindings import BindingError, Bindings, parse_bindings
from injection_webhook.confserver import JoinOptions, PolicyError, parse_extras, parse_node_addresses, parse_policy


def parse_requesters(text: str) -> frozenset[str]:
    """A comma list of usernames; ValueError when it is empty or a name holds whitespace."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("name at least one requester (CAPM3's manager: system:serviceaccount:<namespace>:<name>)")
    spaced = [name for name in names if any(c.isspace() for c in name)]
    if spaced:
        raise ValueError(f"{spaced[0]!r} is not a username: it holds whitespace")
    return frozenset(names)


DEFAULT_CONTROLLER_SELECTOR = "app.kubernetes.io/name=slurmctld,app.kubernetes.io/component=controller"


class InjectionSettings(ServiceSettings):
    allowed_requesters: str = Field(
        CAPM3_MANAGER_USERNAME,
        description="Comma list of the users (request.userInfo.username) whose metaData Secrets get the Slurm join "
        "data: CAPM3's manager (its ServiceAccount, system:serviceaccount:<namespace>:<name>). Every other requester, "
        "and every dry run, is admitted without it.",
    )
    controller_selector: str = Field(
        DEFAULT_CONTROLLER_SELECTOR,
        min_length=1,
        description=(
            "Label selector of the slurmctld pod and StatefulSet (older Slinky releases: "
            "app.kubernetes.io/name=slurm-ctld)."
        ),
        json_schema_extra={"metavar": "SELECTOR"},
    )
    cache_sync_timeout_seconds: float = Field(
        3.0,
        gt=0,
        le=25,
        description=(
            "How long a first admission for a new cluster or namespace waits for its caches; keep below the webhook "
            "timeout."
        ),
    )
    conf_server_policy: str = Field(
        "hostIP",
        description="Default conf-server address policy (a Metal3DataTemplate's slurm-conf-server annotation wins): "
        "hostIP, service, service/<name>, or an explicit host[:port].",
        json_schema_extra={"metavar": "POLICY"},
    )
    conf_server_node_addresses: str = Field(
        "",
        description="Comma-separated stable node addresses (IPs or DNS names) that reach a NodePort Service under "
        "policy service; nodes get them all, tried in order.",
        json_schema_extra={"metavar": "ADDRESSES"},
    )
    extra_join_data: str = Field(
        "",
        description="Default extra join data (a template's slurm-extra-join-data annotation wins): a comma list of "
        "controller-name, jwt-key.",
        json_schema_extra={"metavar": "ITEMS"},
    )

    slurm_bindings: str = Field(
        "",
        description="Comma list of <metal3-namespace>=<slurm-namespace> bindings: Metal3Data in the first namespace "
        "('*': any) may get join data from a Slinky Controller in the second; "
        "<metal3-namespace>=workload:<slurm-namespace> allows the Controller in the Metal3Data's own workload cluster. "
        "Without a binding, only a Controller in the Metal3Data's own namespace.",
        json_schema_extra={"metavar": "BINDINGS"},
    )
    template_opt_ins: str = Field(
        "",
        description="Comma list of the extra join data a template's slurm-extra-join-data annotation may ask for, "
        "beyond --extra-join-data: controller-name, jwt-key. Default none.",
        json_schema_extra={"metavar": "ITEMS"},
    )

    @field_validator("controller_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        problem = label_selector_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("conf_server_policy")
    @classmethod
    def _policy(cls, value: str) -> str:
        try:
            parse_policy(value)
        except PolicyError as exc:
            raise ValueError(f"{value!r} is not a conf-server policy: {exc}") from None
        return value

    @field_validator("conf_server_node_addresses")
    @classmethod
    def _node_addresses(cls, value: str) -> str:
        try:
            parse_node_addresses(value)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("slurm_bindings")
    @classmethod
    def _bindings(cls, value: str) -> str:
        try:
            parse_bindings(value)
        except BindingError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("extra_join_data", "template_opt_ins")
    @classmethod
    def _extras(cls, value: str) -> str:
        try:
            parse_extras(value)
        except PolicyError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("allowed_requesters")
    @classmethod
    def _requesters(cls, value: str) -> str:
        parse_requesters(value)
        return value

    def requesters(self) -> frozenset[str]:
        return parse_requesters(self.allowed_requesters)

    def join_options(self) -> JoinOptions:
        """The validated defaults, parsed (every field was checked above)."""
        return JoinOptions(
            parse_policy(self.conf_server_policy),
            parse_node_addresses(self.conf_server_node_addresses),
            parse_extras(self.extra_join_data),
            parse_extras(self.template_opt_ins),
        )

    def bindings(self) -> Bindings:
        return Bindings(parse_bindings(self.slurm_bindings))
