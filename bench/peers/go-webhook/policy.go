package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// protectedRoot is the dotted path of the operator-owned section (shared/src/policy.rs).
const protectedRoot = "spec.deployment"

// decodeJSON parses raw JSON keeping numbers as json.Number, so integers round-trip exactly
// and 1 and 1.0 stay distinct as they do in serde_json.
func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after the JSON value")
	}
	return v, nil
}

// changedPaths lists, sorted, the dotted paths of the deepest fields whose values differ
// between old and new (both spec.deployment values, nil when absent). A missing key counts as
// null. Mirrors shared/src/policy.rs changed_paths.
func changedPaths(oldV, newV any) []string {
	var out []string
	diff(protectedRoot, oldV, newV, &out)
	slices.Sort(out)
	return out
}

func diff(path string, a, b any, out *[]string) {
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		keys := make([]string, 0, len(am)+len(bm))
		for k := range am {
			keys = append(keys, k)
		}
		for k := range bm {
			if _, dup := am[k]; !dup {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			diff(path+"."+k, am[k], bm[k], out)
		}
		return
	}
	if !jsonEqual(a, b) {
		*out = append(*out, path)
	}
}

// jsonEqual is serde_json's Value equality on values decoded by decodeJSON.
func jsonEqual(a, b any) bool {
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	case json.Number:
		y, ok := b.(json.Number)
		return ok && numberEqual(x, y)
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, xv := range x {
			yv, present := y[k]
			if !present || !jsonEqual(xv, yv) {
				return false
			}
		}
		return true
	default:
		return false
	}
}

// numberEqual compares like serde_json::Number: an integer literal never equals a float one;
// integers compare exactly, floats as float64.
func numberEqual(a, b json.Number) bool {
	if a == b {
		return true
	}
	isFloat := func(n json.Number) bool { return strings.ContainsAny(string(n), ".eE") }
	if isFloat(a) != isFloat(b) {
		return false
	}
	if isFloat(a) {
		x, err1 := strconv.ParseFloat(string(a), 64)
		y, err2 := strconv.ParseFloat(string(b), 64)
		return err1 == nil && err2 == nil && x == y
	}
	x, ok1 := new(big.Int).SetString(string(a), 10)
	y, ok2 := new(big.Int).SetString(string(b), 10)
	return ok1 && ok2 && x.Cmp(y) == 0
}

// privileged are the identities that may change spec.deployment.
type privileged struct {
	users  []string
	groups []string
}

func (p privileged) allows(user string, groups []string) bool {
	if slices.Contains(p.users, user) {
		return true
	}
	for _, g := range groups {
		if slices.Contains(p.groups, g) {
			return true
		}
	}
	return false
}

// describe is the human-readable list used in denial messages.
func (p privileged) describe() string {
	parts := make([]string, 0, len(p.users)+len(p.groups))
	for _, u := range p.users {
		parts = append(parts, "user "+u)
	}
	for _, g := range p.groups {
		parts = append(parts, "group "+g)
	}
	if len(parts) == 0 {
		return "nobody"
	}
	return strings.Join(parts, ", ")
}

// splitList parses a comma-separated flag value, dropping empty entries.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
