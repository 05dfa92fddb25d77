package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
)

// releaseDefaults is this release's spec.deployment in every form the handlers use, built once at
// startup (shared/src/defaults.rs; the value comes from --defaults-file).
type releaseDefaults struct {
	// value is the generic form (decodeJSON): the "before" of the protected-field check on CREATE.
	value map[string]any
	// addPatch is the whole /mutate answer for a spec without deployment:
	// [{"op":"add","path":"/spec/deployment","value":<defaults>}].
	addPatch []byte
	// replacePatch is the answer for "deployment": null (a replace of the same value).
	replacePatch []byte
	// fields are the top-level fields, sorted by key, for filling a partial deployment.
	fields []defaultField
}

// defaultField is one field of the defaults with the JSON patch operations that set it at its
// path under /spec/deployment, pre-encoded.
type defaultField struct {
	key       string
	addOp     []byte
	replaceOp []byte
	// children are the fields of an object value, sorted by key (nil for other values).
	children []defaultField
}

// loadDefaults reads the default spec.deployment once, checks that it is a complete typed
// deployment without unknown fields, and precomputes the patches.
func loadDefaults(path string) (*releaseDefaults, error) {
	if path == "" {
		return nil, fmt.Errorf("--defaults-file is required")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--defaults-file: %w", err)
	}
	return newDefaults(raw)
}

func newDefaults(raw []byte) (*releaseDefaults, error) {
	var typed deployment
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&typed); err != nil {
		return nil, fmt.Errorf("defaults are not a spec.deployment: %w", err)
	}
	if m := typed.missing(); m != "" {
		return nil, fmt.Errorf("defaults are not a spec.deployment: missing field `%s`", m)
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("defaults are not a JSON object")
	}
	value, err := encodeJSON(m)
	if err != nil {
		return nil, err
	}
	d := &releaseDefaults{value: m}
	d.addPatch = []byte(`[` + string(patchOp("add", "/spec/deployment", value)) + `]`)
	d.replacePatch = []byte(`[` + string(patchOp("replace", "/spec/deployment", value)) + `]`)
	d.fields, err = defaultFields(m, "/spec/deployment")
	if err != nil {
		return nil, err
	}
	return d, nil
}

func defaultFields(m map[string]any, path string) ([]defaultField, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]defaultField, 0, len(keys))
	for _, k := range keys {
		p := path + "/" + escapePointer(k)
		value, err := encodeJSON(m[k])
		if err != nil {
			return nil, err
		}
		f := defaultField{key: k, addOp: patchOp("add", p, value), replaceOp: patchOp("replace", p, value)}
		if child, ok := m[k].(map[string]any); ok {
			if f.children, err = defaultFields(child, p); err != nil {
				return nil, err
			}
			if f.children == nil {
				f.children = []defaultField{}
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// fillPatch is the JSON patch that json_patch::diff(current, fill_missing(current, defaults))
// yields in Rust: per object level, in sorted key order, "add" for a missing default field,
// "replace" for a null one, recursion where both sides are objects; existing values are kept.
// nil when nothing is missing.
func (d *releaseDefaults) fillPatch(current map[string]any) []byte {
	ops := appendMissing(nil, current, d.fields)
	if len(ops) == 0 {
		return nil
	}
	return append(append([]byte{'['}, bytes.Join(ops, []byte{','})...), ']')
}

func appendMissing(ops [][]byte, current map[string]any, fields []defaultField) [][]byte {
	for i := range fields {
		f := &fields[i]
		cv, present := current[f.key]
		switch {
		case !present:
			ops = append(ops, f.addOp)
		case cv == nil:
			ops = append(ops, f.replaceOp)
		case f.children != nil:
			if cm, ok := cv.(map[string]any); ok {
				ops = appendMissing(ops, cm, f.children)
			}
		}
	}
	return ops
}

// patchOp encodes one operation as serde_json writes json_patch's PatchOperation.
func patchOp(op, path string, value []byte) []byte {
	p, _ := encodeJSON(path)
	return []byte(`{"op":"` + op + `","path":` + string(p) + `,"value":` + string(value) + `}`)
}

// escapePointer escapes a key as a JSON Pointer token (RFC 6901).
func escapePointer(k string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(k)
}

// encodeJSON marshals like serde_json: sorted map keys, no HTML escaping, no trailing newline.
func encodeJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}
