//go:build tools

// Package tools keeps kube-router in go.mod for `go mod tidy`.
package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
