//go:build tools

// Package tools keeps containerd's commands in go.mod for `go mod tidy`.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd/builtins"
	_ "github.com/containerd/containerd/v2/cmd/ctr/app"
)
