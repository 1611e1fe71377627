//go:build tools

// Package tools pins the Cluster API Provider Metal3 manager built from this module (see ../README.md).
package tools

import (
	_ "github.com/metal3-io/cluster-api-provider-metal3"
)
