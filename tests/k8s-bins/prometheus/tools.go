//go:build tools

// Package tools keeps Prometheus and promtool in go.mod for `go mod tidy`.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
