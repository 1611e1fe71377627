//go:build tools

// Package tools pins the Cluster API core controller manager built from this module (see ../README.md).
package tools

import (
	_ "sigs.k8s.io/cluster-api/core"
)
