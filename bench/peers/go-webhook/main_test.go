package main

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func mustJSON(t *testing.T, s string) any {
	t.Helper()
	v, err := decodeJSON([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func testDefaults(t *testing.T) map[string]any {
	t.Helper()
	d, err := loadDefaults("testdata/defaults.json")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Same case as shared/src/defaults.rs fill_missing_keeps_existing_values.
func TestFillMissingKeepsExistingValues(t *testing.T) {
	d := testDefaults(t)
	cur := mustJSON(t, `{"replicaCount": 3, "image": {"tag": "custom"}}`)
	if !fillMissing(cur, d) {
		t.Fatal("nothing filled")
	}
	m := cur.(map[string]any)
	img := m["image"].(map[string]any)
	if m["replicaCount"] != json.Number("3") || img["tag"] != "custom" || img["registry"] != "docker.io" {
		t.Fatalf("got %v", m)
	}
	if fillMissing(cur, d) {
		t.Fatal("second fill changed something")
	}
	if d["image"].(map[string]any)["tag"] != "2.11.0" {
		t.Fatal("defaults were modified")
	}
}

// Same case as shared/src/policy.rs names_every_changed_leaf.
func TestChangedPathsNamesEveryChangedLeaf(t *testing.T) {
	old := mustJSON(t, `{"replicaCount": 1, "image": {"tag": "1", "registry": "r"}}`)
	nw := mustJSON(t, `{"replicaCount": 2, "image": {"tag": "2", "registry": "r"}, "nodeSelector": {"a": "b"}}`)
	want := []string{"spec.deployment.image.tag", "spec.deployment.nodeSelector", "spec.deployment.replicaCount"}
	if got := changedPaths(old, nw); !slices.Equal(got, want) {
		t.Fatalf("got %v", got)
	}
	if got := changedPaths(old, old); len(got) != 0 {
		t.Fatalf("got %v", got)
	}
	if got := changedPaths(mustJSON(t, `{"n": 1}`), mustJSON(t, `{"n": 1.0}`)); len(got) != 1 {
		t.Fatalf("1 and 1.0 differ in serde_json, got %v", got)
	}
}

func request(t *testing.T, file string) admission.Request {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(raw, &review); err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: *review.Request}
}

func TestHandlersOnTestdata(t *testing.T) {
	d := testDefaults(t)
	ctx := context.Background()

	resp := (&mutator{defaults: d}).Handle(ctx, request(t, "testdata/mutate-create.json"))
	if !resp.Allowed || len(resp.Patches) != 1 || resp.Patches[0].Path != "/spec/deployment" {
		t.Fatalf("mutate: %+v", resp)
	}

	v := &validator{defaults: d, privileged: privileged{users: []string{"op"}}}
	req := request(t, "testdata/validate-update-replicas.json")
	resp = v.Handle(ctx, req)
	if resp.Allowed || resp.Result.Code != 403 ||
		!strings.Contains(resp.Result.Message, "refused spec.deployment.replicaCount. Only user op may") {
		t.Fatalf("validate: %+v", resp.Result)
	}
	req.UserInfo.Username = "op"
	if resp = v.Handle(ctx, req); !resp.Allowed {
		t.Fatalf("privileged user denied: %+v", resp.Result)
	}
}
