//go:build tools

// Package tools keeps the Kubernetes server commands in go.mod for `go mod tidy`.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubectl/pkg/cmd"
)
