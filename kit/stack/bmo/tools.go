//go:build tools

// Package tools pins the baremetal-operator manager built from this module (see ../README.md).
package tools

import (
	_ "github.com/metal3-io/baremetal-operator"
)
