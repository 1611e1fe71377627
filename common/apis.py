"""Every Kubernetes API version SliMe speaks and every fixed resource path, each spelled once.

Custom resources whose served version depends on the installed release (Metal3, Cluster API,
Slinky) are listed as the versions SliMe understands, newest first: the services discover which
one the cluster serves (:meth:`common.kube.KubeClient.resource`). Core resources have one path.
"""

from __future__ import annotations

from typing import Final

from common.kube import ResourcePath
from common.names import BAREMETAL_GROUP

# Custom resources: the versions SliMe reads, newest first (matched by group and kind, never by version).
METAL3_VERSIONS: Final = ("v1beta2", "v1beta1")  # CAPM3 >= 1.13 serves both; up to 1.12 only v1beta1
CAPI_VERSIONS: Final = ("v1beta2", "v1beta1")  # Cluster API: v1beta2 is the storage version from 1.11
SLINKY_VERSIONS: Final = ("v1beta1", "v1alpha1")  # Slinky slurm-operator 1.x, 0.4.x

# Core and fixed-version resources.
EVENTS: Final = ResourcePath("", "v1", "events")
PODS: Final = ResourcePath("", "v1", "pods")
SERVICES: Final = ResourcePath("", "v1", "services")
SECRETS: Final = ResourcePath("", "v1", "secrets")
CONFIGMAPS: Final = ResourcePath("", "v1", "configmaps")
DEPLOYMENTS: Final = ResourcePath("apps", "v1", "deployments")
STATEFULSETS: Final = ResourcePath("apps", "v1", "statefulsets")
LEASES: Final = ResourcePath("coordination.k8s.io", "v1", "leases")
BAREMETALHOSTS: Final = ResourcePath(BAREMETAL_GROUP, "v1alpha1", "baremetalhosts")
SUBJECT_ACCESS_REVIEWS: Final = ResourcePath("authorization.k8s.io", "v1", "subjectaccessreviews")
ADMISSION_REGISTRATION: Final = "/apis/admissionregistration.k8s.io/v1"
