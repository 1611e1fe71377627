"""Pure handler and metaData editing: no server, no cluster."""

from __future__ import annotations

import base64

import jsonpatch
import pytest
import yaml

from injection_webhook.decision import JoinInfo, NotOptedIn, Unresolved, Unverified, respond, select, withheld, withhold
from injection_webhook.metadata import JOIN_KEYS, MetaDataError, join_entries, merged_metadata
from testbed.framework.objects import b64
from testbed.framework.reviews import secret_request

OWNER = {
    "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
    "kind": "Metal3Data",
    "name": "tmpl-0",
    "uid": "u1",
    "controller": True,
}
INFO = JoinInfo(
    host="192.0.2.10",
    port=30817,
    key_base64=b64(b"k" * 64),
    source="Controller slurm/slurm in cluster local",
    hosts_file="192.0.2.10 slurm-controller-0.slurm-controller-internal.slurm slurm-controller.slurm\n",
    node_conf="Feature=nodeset-a",
)


def secret(metadata_yaml: str = "providerid: metal3/bmh-0/m3m-0\n", owners: list | None = None, **data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "m3m-0-metadata",
            "namespace": "metal3",
            "labels": {"cluster.x-k8s.io/cluster-name": "c1"},
            "ownerReferences": [OWNER] if owners is None else owners,
        },
        "data": {"metaData": b64(metadata_yaml), **data},
    }


def test_select_reads_the_metal3_facts() -> None:
    target = select(secret_request(secret()))
    assert target is not None
    assert (target.namespace, target.name, target.metal3data, target.metal3data_uid) == (
        "metal3",
        "m3m-0-metadata",
        "tmpl-0",
        "u1",
    )
    assert (target.requester, target.dry_run) == ("system:serviceaccount:capm3-system:capm3-manager", False)


@pytest.mark.parametrize(
    "api_version", ["infrastructure.cluster.x-k8s.io/v1beta1", "infrastructure.cluster.x-k8s.io/v1beta2"]
)
def test_select_matches_owner_by_kind_and_group_any_version(api_version: str) -> None:
    assert select(secret_request(secret(owners=[{**OWNER, "apiVersion": api_version}]))) is not None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.update(operation="DELETE"),
        lambda r: r.update(operation="CONNECT"),
        lambda r: r.update(kind={"group": "", "version": "v1", "kind": "ConfigMap"}),
        lambda r: r.update(kind={"group": "example.com", "version": "v1", "kind": "Secret"}),
        lambda r: r.update(object=None),
        lambda r: r.update(object="not an object"),
        lambda r: r["object"].update(data=None),
        lambda r: r["object"].update(data={"value": "eA=="}),
        lambda r: r["object"]["data"].update(metaData=42),
        lambda r: r["object"]["metadata"].update(ownerReferences=[]),
        lambda r: r["object"]["metadata"].update(ownerReferences=[{**OWNER, "kind": "Metal3Machine"}]),
        lambda r: r["object"]["metadata"].update(ownerReferences=[{**OWNER, "apiVersion": "example.com/v1"}]),
        lambda r: r["object"]["metadata"].update(ownerReferences=[{**OWNER, "apiVersion": "v1"}]),
        lambda r: r["object"]["metadata"].update(ownerReferences="garbage"),
        lambda r: r["object"].update(metadata="garbage"),
        lambda r: r["object"]["metadata"].update(ownerReferences=7),
        lambda r: r["object"]["metadata"].update(ownerReferences=True),
        lambda r: r["object"]["metadata"].update(ownerReferences=[{**OWNER, "name": ""}]),
        lambda r: r["object"]["metadata"].update(ownerReferences=[{**OWNER, "name": "\ud800"}]),
        lambda r: r.update(namespace="\ud800"),
        lambda r: r.update(namespace="Not_A_Namespace"),
    ],
    ids=[
        "delete",
        "connect",
        "configmap",
        "other-group",
        "no-object",
        "string-object",
        "no-data",
        "no-metaData",
        "metaData-not-string",
        "no-owners",
        "other-owner-kind",
        "other-owner-group",
        "core-owner",
        "owners-not-list",
        "metadata-not-map",
        "owners-number",
        "owners-bool",
        "owner-empty-name",
        "owner-surrogate-name",
        "namespace-surrogate",
        "namespace-invalid",
    ],
)
def test_select_ignores_everything_else(mutate) -> None:  # type: ignore[no-untyped-def]
    request = secret_request(secret())
    mutate(request)
    assert select(request) is None


def test_respond_patches_one_replace_and_keeps_every_existing_key() -> None:
    original = secret("providerid: metal3/bmh-0/m3m-0\nlocal-hostname: node-0\nname: 'x: y'\n")
    response = respond(select(secret_request(original)), INFO)  # type: ignore[arg-type]
    assert response.allowed and response.outcome == "patched"
    assert (
        len(response.patch) == 1
        and response.patch[0]["op"] == "replace"
        and response.patch[0]["path"] == "/data/metaData"
    )
    patched = jsonpatch.apply_patch(original, response.patch)
    content = yaml.safe_load(base64.b64decode(patched["data"]["metaData"]))
    assert content == {
        "providerid": "metal3/bmh-0/m3m-0",
        "local-hostname": "node-0",
        "name": "x: y",
        "slurm_controller_host": "192.0.2.10",
        "slurm_controller_port": "30817",
        "slurm_conf_server": "192.0.2.10:30817",
        "slurm_key_base64": INFO.key_base64,
        "slurm_hosts_base64": b64(INFO.hosts_file.encode()),
        "slurm_node_conf": "Feature=nodeset-a",
    }
    # the original bytes are kept verbatim, the new keys appended
    assert base64.b64decode(patched["data"]["metaData"]).startswith(base64.b64decode(original["data"]["metaData"]))


def test_respond_is_idempotent() -> None:
    once = jsonpatch.apply_patch(secret(), respond(select(secret_request(secret())), INFO).patch)  # type: ignore[arg-type]
    again = respond(select(secret_request(once)), INFO)  # type: ignore[arg-type]
    assert again.allowed and again.outcome == "allowed" and again.patch is None


def test_respond_updates_stale_values_when_slurmctld_moved() -> None:
    moved = JoinInfo(host="192.0.2.99", port=6817, key_base64=INFO.key_base64, source="x")
    once = jsonpatch.apply_patch(secret(), respond(select(secret_request(secret())), INFO).patch)  # type: ignore[arg-type]
    response = respond(select(secret_request(once, "UPDATE")), moved)  # type: ignore[arg-type]
    content = yaml.safe_load(base64.b64decode(response.patch[0]["value"]))
    assert content["slurm_conf_server"] == "192.0.2.99:6817" and content["providerid"] == "metal3/bmh-0/m3m-0"
    assert list(content).count("slurm_controller_host") == 1


def test_not_opted_in_allows_without_patch() -> None:
    response = respond(select(secret_request(secret())), NotOptedIn())  # type: ignore[arg-type]
    assert response.allowed and response.patch is None and response.outcome == "allowed"


def test_unresolved_denies_naming_the_secret_and_reason() -> None:
    response = respond(select(secret_request(secret())), Unresolved("no slurmctld pod in namespace slurm"))  # type: ignore[arg-type]
    assert not response.allowed and response.code == 403
    assert (
        response.message
        == "cannot inject Slurm join data into Secret metal3/m3m-0-metadata: no slurmctld pod in namespace slurm"
    )


@pytest.mark.parametrize(
    ("encoded", "message"),
    [
        ("%%%not-base64", "data.metaData is not valid base64 of UTF-8 text"),
        (base64.b64encode(b"\xff\xfe").decode(), "data.metaData is not valid base64 of UTF-8 text"),
        (b64("a: 'unclosed\n"), "data.metaData is not valid YAML (line 2)"),
        (b64("a: [unclosed\n"), "data.metaData has a nested value (line 1); CAPM3 writes a flat map of strings"),
        (b64("a: &x b\nc: *x\n"), "data.metaData uses a YAML anchor (line 1); CAPM3 writes a flat map of strings"),
        (b64("c: *x\n"), "data.metaData uses a YAML alias (line 1); CAPM3 writes a flat map of strings"),
        (b64("a: !!binary aGk=\n"), "data.metaData uses a YAML tag (line 1); CAPM3 writes a flat map of strings"),
        (b64("a: {b: c}\n"), "data.metaData has a nested value (line 1); CAPM3 writes a flat map of strings"),
        (b64("a: b\n---\nc: d\n"), "data.metaData holds more than one YAML document (line 2); expected one map"),
        (b64("".join(f"k{i}: v\n" for i in range(1001))), "data.metaData has more than 1000 keys"),
        (b64("- a\n- b\n"), "data.metaData is a YAML list, expected a map"),
        (b64("just text"), "data.metaData is a YAML str, expected a map"),
    ],
)
def test_malformed_metadata_is_denied_with_the_cause(encoded: str, message: str) -> None:
    request = secret_request(secret())
    request["object"]["data"]["metaData"] = encoded
    response = respond(select(request), INFO)  # type: ignore[arg-type]
    assert not response.allowed and response.code == 400
    assert response.message == f"cannot inject Slurm join data into Secret metal3/m3m-0-metadata: {message}"
    assert INFO.key_base64 not in response.message


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{providerid: a/b/c}",
        "---\nproviderid: a/b/c\n",
        "providerid: a/b/c",  # no trailing newline
        "  providerid: a/b/c\n  other: x\n",
        "# comment\nproviderid: a/b/c\n",
        "providerid: a/b/c\nmulti: |\n  line one\n  line two\n",
        "slurm_controller_host: stale\nproviderid: a/b/c\n",
        "'quoted key': v\n",
        "providerid: a/b/c\n...\n",
    ],
)
def test_merged_metadata_always_yields_the_merged_map(text: str) -> None:
    entries = join_entries("10.0.0.1", 6817, "a2V5")
    before = yaml.safe_load(text) or {}
    result = merged_metadata(b64(text), entries)
    assert result is not None
    assert yaml.safe_load(base64.b64decode(result)) == {**before, **entries}


def test_join_entries_are_strings_with_snake_case_names() -> None:
    entries = join_entries("10.0.0.1", 30817, "a2V5")
    assert tuple(entries) == JOIN_KEYS and all(isinstance(v, str) for v in entries.values())
    assert entries["slurm_conf_server"] == "10.0.0.1:30817"


def test_metadata_error_never_quotes_content() -> None:
    with pytest.raises(MetaDataError) as caught:
        merged_metadata(b64("secret-value: [\n"), join_entries("h", 1, "k"))
    assert "secret-value" not in str(caught.value)


def test_join_info_repr_hides_the_key() -> None:
    assert INFO.key_base64 not in repr(INFO)


def test_an_unverified_owner_gets_one_message_that_reveals_nothing() -> None:
    """Missing, wrong uid, another namespace: the resolver's verdict is Unverified, answered alike."""
    response = respond(select(secret_request(secret())), Unverified())  # type: ignore[arg-type]
    assert not response.allowed and response.patch is None and response.code == 403
    assert response.message == (
        "cannot inject Slurm join data into Secret metal3/m3m-0-metadata: its owner reference does not name a "
        "Metal3Data SliMe can verify (CAPM3 creates this Secret owned by its Metal3Data, with that Metal3Data's uid)"
    )


ALLOWED = frozenset({"system:serviceaccount:capm3-system:capm3-manager"})


@pytest.mark.parametrize(
    ("requester", "dry_run", "reason", "warning"),
    [
        ("system:serviceaccount:capm3-system:capm3-manager", True, "dry-run", "this is a dry run"),
        ("tenant", False, "requester", "this requester may not receive it"),
        ("", False, "requester", "this requester may not receive it"),
        ("tenant", True, "dry-run", "this is a dry run"),
    ],
)
def test_join_data_is_withheld_from_dry_runs_and_other_requesters(
    requester: str, dry_run: bool, reason: str, warning: str
) -> None:
    target = select(secret_request(secret(), requester=requester, dry_run=dry_run))
    assert target is not None and withheld(target, ALLOWED) == reason
    response = withhold(target, reason)
    assert response.allowed and response.patch is None and response.outcome == "allowed"
    assert response.warnings == (f"SliMe added no Slurm join data: {warning}",)
    assert response.message.startswith("Slurm join data withheld from Secret metal3/m3m-0-metadata: ")
    assert (requester or "(none)") in response.message or reason == "dry-run"


def test_capm3_on_a_stored_request_is_entitled() -> None:
    target = select(secret_request(secret()))
    assert target is not None and withheld(target, ALLOWED) is None


def test_an_update_that_leaves_metadata_alone_is_recognised() -> None:
    """The baremetal-operator labels the Secret it consumes: metaData unchanged, nothing to add or withhold."""
    stored = secret()
    labelled = {**stored, "metadata": {**stored["metadata"], "labels": {"environment.metal3.io": "baremetal"}}}
    same = select(secret_request(labelled, "UPDATE", requester="bmo", old=stored))
    changed = select(secret_request(secret("other: x\n"), "UPDATE", requester="bmo", old=stored))
    assert same is not None and same.metadata_unchanged
    assert changed is not None and not changed.metadata_unchanged
