"""The names SliMe shares with the outside world, each spelled once.

Labels and annotations an operator or another controller writes or reads, the keys the
injection webhook adds to the Metal3 ``metaData`` (cloud-init reads them as
``ds.meta_data.<key>``), the keys of the scaling ConfigMap, and the reasons of the Events the
services raise. Code imports them from here; ``tests/common/test_names.py`` holds the chart and
``docs/interfaces.md`` against this module, so a name cannot change in one place only.
Names that belong to upstream projects (Cluster API, Metal3, Slinky) are here too when the
product depends on their exact spelling.
"""

from __future__ import annotations

from typing import Final

# --- the services: their Event component and API user agent --------------------------------
INJECTION_COMPONENT: Final = "slime-injection-webhook"
SCALING_COMPONENT: Final = "slime-scaling-webhook"
TEARDOWN_COMPONENT: Final = "slime-teardown"  # the chart's pre-delete hook (helm uninstall)

# The identity CAPM3's manager runs as in its upstream manifests (cluster-api-provider-metal3
# config/default/capm3/kustomization.yaml: namespace capm3-system, namePrefix capm3-; and
# config/rbac/service_account.yaml: ServiceAccount manager): the injection webhook's default
# --allowed-requesters.
CAPM3_MANAGER_USERNAME: Final = "system:serviceaccount:capm3-system:capm3-manager"

# --- upstream names the product relies on -----------------------------------------------------
METAL3_GROUP: Final = "infrastructure.cluster.x-k8s.io"
BAREMETAL_GROUP: Final = "metal3.io"  # the baremetal-operator's BareMetalHost
CAPI_GROUP: Final = "cluster.x-k8s.io"
SLINKY_GROUP: Final = "slinky.slurm.net"
CLUSTER_NAME_LABEL: Final = "cluster.x-k8s.io/cluster-name"
CAPI_SECRET_TYPE: Final = "cluster.x-k8s.io/secret"  # the type of the Secrets Cluster API writes (kubeconfigs)
DEPLOYMENT_NAME_LABEL: Final = "cluster.x-k8s.io/deployment-name"
CAPI_PAUSED_ANNOTATION: Final = "cluster.x-k8s.io/paused"
DELETE_MACHINE_ANNOTATION: Final = "cluster.x-k8s.io/delete-machine"
BMH_PAUSED_ANNOTATION: Final = "baremetalhost.metal3.io/paused"
NODE_REUSE_LABEL: Final = "infrastructure.cluster.x-k8s.io/node-reuse"
# CAPM3 marks a host it must not use again with either of these (older and newer spelling).
UNHEALTHY_ANNOTATIONS: Final = ("capm3.metal3.io/unhealthy", "capi.metal3.io/unhealthy")
# cluster-autoscaler's Cluster API provider: a MachineDeployment with these is its node group.
AUTOSCALER_ANNOTATIONS: Final = (
    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size",
    "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size",
)
# cert-manager's CA injector fills a webhook configuration's caBundle from the Certificate this names.
INJECT_CA_FROM_ANNOTATION: Final = "cert-manager.io/inject-ca-from"
METADATA_KEY: Final = "metaData"  # the one key of CAPM3's metadata Secret
# Slinky >= 1.3 runs slurmctld with high availability and marks the active pod with this label.
ACTIVE_CONTROLLER_LABEL: Final = "controller.slinky.slurm.net/active"
CAPI_PROVIDER_LABEL: Final = "cluster.x-k8s.io/provider"  # on a provider's Deployment (clusterctl)
CAPM3_PROVIDER: Final = "infrastructure-metal3"  # CAPM3's value of that label

# --- Metal3DataTemplate: opt-in and per-template choices (injection) --------------------------
OPT_IN_LABEL: Final = "slurm-controller-namespace"
CLUSTER_OVERRIDE_LABEL: Final = "slurm-controller-cluster"
CONTROLLER_NAME_LABEL: Final = "slurm-controller-name"
CONF_SERVER_ANNOTATION: Final = "slurm-conf-server"
EXTRA_JOIN_DATA_ANNOTATION: Final = "slurm-extra-join-data"
NODE_FEATURES_ANNOTATION: Final = "slurm-node-features"  # the NodeSet feature(s) the pool's nodes register with

# --- keys added to metaData (cloud-init: ds.meta_data.<key>) ----------------------------------
CONTROLLER_HOST_KEY: Final = "slurm_controller_host"
CONTROLLER_PORT_KEY: Final = "slurm_controller_port"
CONF_SERVER_KEY: Final = "slurm_conf_server"
SLURM_KEY_KEY: Final = "slurm_key_base64"
CONTROLLER_NAME_KEY: Final = "slurm_controller_name"
JWT_KEY_KEY: Final = "slurm_jwt_hs256_key_base64"
HOSTS_KEY: Final = "slurm_hosts_base64"  # /etc/hosts lines: the controller's slurm.conf names -> its address
NODE_CONF_KEY: Final = "slurm_node_conf"  # what slurmd -Z gets as --conf: "Feature=<f>,..." or ""

# --- scaling: annotations on mirrors and Machines, the ConfigMap's keys ------------------------
ADOPTED_ANNOTATION: Final = "slime/machine-deployment"
SLURM_NODE_ANNOTATION: Final = "slime/slurm-node"
DELETE_MACHINE_VALUE: Final = "slime"
# The lifecycle hook that holds a deleting Machine until Slurm lets its node go. Cluster API waits
# for pre-terminate hooks on every Machine (after drain, before the infrastructure is deleted);
# pre-drain hooks only on Machines with a nodeRef, which a host without a kubelet never gets.
PRE_TERMINATE_HOOK: Final = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/slime"
# What SliMe before 0.2 set instead; removed from the Machines it finds it on.
LEGACY_PRE_DRAIN_HOOK: Final = "pre-drain.delete.hook.machine.cluster.x-k8s.io/slime"
HOOK_OWNER: Final = SCALING_COMPONENT  # the value of the lifecycle hook annotations: who holds them
MAPPINGS_KEY: Final = "mappings"
MAX_REPLICAS_KEY: Final = "maxReplicas"
SAFE_SCALE_IN_KEY: Final = "safeScaleIn"
CAPACITY_AWARE_KEY: Final = "capacityAware"
NODE_DEMAND_KEY: Final = "nodeDemand"
SLURM_HEALTH_KEY: Final = "slurmHealth"
# Machine health: the condition SliMe writes on a pool's Machines (a Cluster API-style condition of
# SliMe's own type), and the annotation on a Machine it deleted because its host is not a working node.
HEALTH_CONDITION: Final = "SlurmNodeHealthy"
REMEDIATED_ANNOTATION: Final = "slime/remediated"

# --- labels and annotations the chart sets (no code reads them; named here so they stay unique) --
MIRROR_LABEL: Final = "slime/mirror"  # on mirror Deployments and their ScaledObjects: the mirror's name
MD_NAMESPACE_ANNOTATION: Final = "slime/machine-deployment-namespace"  # on mirrors: where their pool lives
MIRROR_SCHEDULING_GATE: Final = "slime/never-scheduled"  # on mirror pods: they stay API objects only
TLS_SOURCE_ANNOTATION: Final = "slime/tls-source"  # on chart-generated TLS Secrets
PURPOSE_ANNOTATION: Final = "slime/purpose"  # on the generated kube-apiserver client certificate
PREREQUISITES_ANNOTATION: Final = "slime/prerequisites"  # in Chart.yaml: the optional CRD groups

# --- Event reasons (injection webhook, on a Metal3Data) -----------------------------------------
REASON_JOIN_DATA_WITHHELD: Final = "SlurmJoinDataWithheld"

# --- Event reasons (scaling webhook) ----------------------------------------------------------
REASON_SCALED: Final = "ScaledFromMirror"
REASON_DRIFT: Final = "DriftCorrected"
REASON_ADOPTED: Final = "AdoptedByMirror"
REASON_AUTOSCALER: Final = "ClusterAutoscalerManaged"
REASON_PAUSED: Final = "WaitingForUnpause"
REASON_CAPPED: Final = "ReplicasCapped"
REASON_CAPACITY: Final = "CapacityLimited"
REASON_VICTIMS: Final = "ScaleInVictims"
REASON_DEFERRED: Final = "ScaleInDeferred"
REASON_SLURM: Final = "SlurmUnavailable"
REASON_RECLAIMED: Final = "Reclaimed"
REASON_NODE_FUTURE: Final = "SlurmNodeReturnedToFuture"
REASON_NODE_DELETED: Final = "SlurmNodeDeleted"
REASON_RELEASED: Final = "ReleasedNeverJoined"
REASON_DRAIN_OVERDUE: Final = "DrainOverdue"
REASON_UNDRAINED: Final = "OrphanDrainUndone"
REASON_SAFE_SCALE_IN_OFF: Final = "SafeScaleInOff"  # a pool left safe scale-in: SliMe's hooks and marks are off
REASON_SAFE_SCALE_IN_OFF_WAITING: Final = "SafeScaleInOffWaiting"  # ... but a held Machine's node is still busy
REASON_NODE_UNHEALTHY: Final = "SlurmNodeUnhealthy"  # on a Machine: never registered, or lost (machine health)
REASON_NODE_HEALTHY: Final = "SlurmNodeHealthy"  # on a Machine judged unhealthy before: it works again
REASON_REMEDIATED: Final = "MachineRemediated"  # an unhealthy Machine deleted, for the MachineSet to replace
REASON_SHORT_CIRCUIT: Final = "RemediationShortCircuited"  # more unhealthy than maxUnhealthy: none remediated
