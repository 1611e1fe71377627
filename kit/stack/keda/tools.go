//go:build tools

// Package tools pins KEDA's operator, metrics adapter and admission webhooks, built from this
// module (see ../README.md).
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
	_ "github.com/kedacore/keda/v2/cmd/webhooks"
)
