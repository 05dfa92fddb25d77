//go:build tools

// Package tools keeps etcd's server in go.mod for `go mod tidy`.
package tools

import _ "go.etcd.io/etcd/server/v3/etcdmain"
