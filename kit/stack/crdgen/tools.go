//go:build tools

// Package tools pins controller-gen and the API types it generates CRDs from (see ../README.md):
// CAPM3's (the Metal3 CRDs of the real-Kubernetes tier).
package tools

import (
	_ "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta1"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
