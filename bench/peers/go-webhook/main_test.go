package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// TestMain gives controller-runtime's global logger a sink: the tests and benchmarks pass their
// request loggers through LogConstructor, and nothing else should print.
func TestMain(m *testing.M) {
	logf.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

func mustJSON(t testing.TB, s string) any {
	t.Helper()
	v, err := decodeJSON([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func testDefaults(t testing.TB) *releaseDefaults {
	t.Helper()
	d, err := loadDefaults("testdata/defaults.json")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

const controllerSA = "system:serviceaccount:kyma-system:cp-controller"

func testValidator(t testing.TB) *validator {
	return &validator{defaults: testDefaults(t), privileged: privileged{users: []string{controllerSA}}}
}

// request decodes an AdmissionReview file's request, as controller-runtime hands it to Handle.
func request(t testing.TB, file string) admission.Request {
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

// defaultCR is the module's default CR (manifests/default-cr.yaml) as the bench sends it.
func defaultCR(t testing.TB) map[string]any {
	t.Helper()
	req := request(t, "testdata/bench-mutate-create.json")
	return mustJSON(t, string(req.Object.Raw)).(map[string]any)
}

// defaultedCR is the default CR with spec.deployment defaulted, as stored after admission.
func defaultedCR(t testing.TB) map[string]any {
	t.Helper()
	req := request(t, "testdata/bench-validate-update.json")
	return mustJSON(t, string(req.OldObject.Raw)).(map[string]any)
}

func spec(obj map[string]any) map[string]any { return obj["spec"].(map[string]any) }

func sub(m map[string]any, key string) map[string]any { return m[key].(map[string]any) }

// review builds a request like webhook/src/admission/tests.rs review_body.
func review(t testing.TB, op admissionv1.Operation, user string, object, old any) admission.Request {
	t.Helper()
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "uid-1",
		Name:      "connectivity-proxy",
		Namespace: "kyma-system",
		Operation: op,
	}}
	req.Kind.Group, req.Kind.Version, req.Kind.Kind = group, "v1", kind
	req.UserInfo.Username = user
	req.UserInfo.Groups = []string{"system:authenticated"}
	var err error
	if req.Object.Raw, err = encodeJSON(object); err != nil {
		t.Fatal(err)
	}
	if old != nil {
		if req.OldObject.Raw, err = encodeJSON(old); err != nil {
			t.Fatal(err)
		}
	}
	return req
}

func deepCopy(t testing.TB, v map[string]any) map[string]any {
	t.Helper()
	raw, err := encodeJSON(v)
	if err != nil {
		t.Fatal(err)
	}
	return mustJSON(t, string(raw)).(map[string]any)
}

func message(resp admission.Response) string {
	if resp.Result == nil {
		return ""
	}
	return resp.Result.Message
}

func wantDenied(t *testing.T, resp admission.Response, code int32, contains string) {
	t.Helper()
	if resp.Allowed || resp.Result == nil || resp.Result.Code != code || !strings.Contains(resp.Result.Message, contains) {
		t.Fatalf("want %d containing %q, got allowed=%v %+v", code, contains, resp.Allowed, resp.Result)
	}
}

func wantAllowed(t *testing.T, resp admission.Response) {
	t.Helper()
	if !resp.Allowed {
		t.Fatalf("denied: %+v", resp.Result)
	}
}

// The defaults patch is the Rust webhook's, byte for byte: one "add" of the whole value.
func TestMutateCreateIsOneAddOperation(t *testing.T) {
	d := testDefaults(t)
	resp := (&mutator{defaults: d}).decide(request(t, "testdata/bench-mutate-create.json"))
	wantAllowed(t, resp)
	defaults, err := os.ReadFile("testdata/defaults.json")
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"op":"add","path":"/spec/deployment","value":` + string(bytes.TrimSpace(defaults)) + `}]`
	if string(resp.Patch) != want || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch %s (type %v), want %s", resp.Patch, resp.PatchType, want)
	}
	if len(resp.Patches) != 0 {
		t.Fatalf("Patches set: %v", resp.Patches)
	}
	// "deployment": null is replaced by the same value.
	cr := defaultCR(t)
	spec(cr)["deployment"] = nil
	resp = (&mutator{defaults: d}).decide(review(t, admissionv1.Create, "alice", cr, nil))
	if want := strings.Replace(want, `"add"`, `"replace"`, 1); string(resp.Patch) != want {
		t.Fatalf("patch %s, want %s", resp.Patch, want)
	}
}

// Same cases as webhook/src/admission/tests.rs mutate_is_idempotent_and_fills_only_missing and
// shared/src/defaults.rs fill_missing_keeps_existing_values.
func TestMutateFillsOnlyMissingFields(t *testing.T) {
	m := &mutator{defaults: testDefaults(t)}
	resp := m.decide(review(t, admissionv1.Update, "alice", defaultedCR(t), defaultedCR(t)))
	wantAllowed(t, resp)
	if resp.Patch != nil {
		t.Fatalf("a defaulted CR got a patch: %s", resp.Patch)
	}
	partial := defaultedCR(t)
	dep := sub(spec(partial), "deployment")
	dep["replicaCount"] = 3
	delete(sub(dep, "image"), "tag")
	dep["restartWatcher"] = nil
	delete(sub(sub(dep, "resources"), "limits"), "cpu")
	dep["nodeSelector"] = "not an object" // left alone, as fill_missing does
	resp = m.decide(review(t, admissionv1.Update, "alice", partial, defaultedCR(t)))
	want := `[{"op":"add","path":"/spec/deployment/image/tag","value":"2.11.0"},` +
		`{"op":"add","path":"/spec/deployment/resources/limits/cpu","value":"1000m"},` +
		`{"op":"replace","path":"/spec/deployment/restartWatcher","value":{"enabled":true}}]`
	if string(resp.Patch) != want {
		t.Fatalf("patch %s, want %s", resp.Patch, want)
	}
	// A deployment that is not an object is left alone.
	cr := defaultCR(t)
	spec(cr)["deployment"] = "x"
	if resp = m.decide(review(t, admissionv1.Create, "alice", cr, nil)); !resp.Allowed || resp.Patch != nil {
		t.Fatalf("got %+v", resp)
	}
	// No spec: 422.
	delete(cr, "spec")
	wantDenied(t, m.decide(review(t, admissionv1.Create, "alice", cr, nil)), 422, "object has no spec")
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

func TestProtectedFields(t *testing.T) {
	v := testValidator(t)
	v.privileged.groups = []string{"system:masters"}
	req := request(t, "testdata/validate-update-replicas.json")
	wantDenied(t, v.decide(req), 403, "refused spec.deployment.replicaCount. Only user "+controllerSA+", group system:masters may")
	req.UserInfo.Username = controllerSA
	wantAllowed(t, v.decide(req))
	req.UserInfo.Username = "bob"
	req.UserInfo.Groups = []string{"system:masters"}
	wantAllowed(t, v.decide(req))
	// CREATE compares against the release defaults (create_with_non_default_deployment_is_refused_for_users).
	cr := defaultedCR(t)
	sub(spec(cr), "deployment")["replicaCount"] = 2
	wantDenied(t, v.decide(review(t, admissionv1.Create, "alice", cr, nil)), 403, "spec.deployment.replicaCount")
	wantAllowed(t, v.decide(review(t, admissionv1.Create, "alice", defaultedCR(t), nil)))
}

// unknown_fields_are_refused: only the new object's spec is checked, every unknown field is named
// with its path, and a null-valued one is ignored (serde's round trip does not see it).
func TestTypedDecodeRefusesUnknownSpecFields(t *testing.T) {
	v := testValidator(t)
	cr := defaultedCR(t)
	sub(spec(cr), "config")["bogus"] = 1
	sub(sub(spec(cr), "ingress"), "tls")["extra"] = map[string]any{"a": 1}
	wantDenied(t, v.decide(review(t, admissionv1.Create, "alice", cr, nil)), 422,
		"object has unknown fields: spec.config.bogus, spec.ingress.tls.extra")

	cr = defaultedCR(t)
	sub(sub(spec(cr), "deployment"), "image")["bogus"] = "x"
	wantDenied(t, v.decide(review(t, admissionv1.Create, controllerSA, cr, nil)), 422,
		"object has unknown fields: spec.deployment.image.bogus")

	// Unknown fields outside the spec, and null-valued ones inside it, are accepted.
	cr = defaultedCR(t)
	cr["status"] = map[string]any{"state": "Ready", "anything": []any{1}}
	cr["extra"] = true
	sub(cr, "metadata")["labels"] = map[string]any{"a": "b"}
	sub(spec(cr), "config")["bogus"] = nil
	wantAllowed(t, v.decide(review(t, admissionv1.Create, "alice", cr, nil)))

	// The stored oldObject is parsed without the check; the new spec's type errors and missing
	// fields come first, as serde reports them.
	old := defaultedCR(t)
	sub(spec(old), "config")["bogus"] = 1
	nw := deepCopy(t, old)
	delete(sub(spec(nw), "config"), "bogus")
	sub(spec(nw), "config")["tenantMode"] = "shared"
	wantAllowed(t, v.decide(review(t, admissionv1.Update, "alice", nw, old)))
	cr = defaultedCR(t)
	sub(spec(cr), "config")["bogus"] = 1
	sub(sub(sub(spec(cr), "config"), "servers"), "businessDataTunnel")["externalPort"] = "443"
	wantDenied(t, v.decide(review(t, admissionv1.Create, "alice", cr, nil)), 422, "object: spec: json: cannot unmarshal string")
	cr = defaultedCR(t)
	sub(spec(cr), "config")["bogus"] = 1
	delete(sub(sub(spec(cr), "config"), "servers"), "businessDataTunnel")
	wantDenied(t, v.decide(review(t, admissionv1.Create, "alice", cr, nil)), 422,
		"object: spec: missing field `businessDataTunnel`")
	cr = defaultedCR(t)
	delete(spec(cr), "config")
	wantDenied(t, v.decide(review(t, admissionv1.Create, "alice", cr, nil)), 422, "object: spec: missing field `config`")
}

// cross_field_rules_are_enforced, with every message of the multi-region rules.
func TestCrossFieldRuleDenial(t *testing.T) {
	v := testValidator(t)
	cr := defaultedCR(t)
	sub(spec(cr), "config")["multiRegionMode"] = map[string]any{"enabled": true}
	wantDenied(t, v.decide(review(t, admissionv1.Create, "alice", cr, nil)), 422,
		"ConnectivityProxy connectivity-proxy is invalid: "+
			"spec.config.multiRegionMode.configMapName: required when multiRegionMode.enabled is true; "+
			"spec.config.serviceChannels.enabled: must be false when multiRegionMode.enabled is true "+
			"(multi-region mode does not support service channels); "+
			"spec.config.tenantMode: must be shared when multiRegionMode.enabled is true")

	cases := []struct {
		edit func(s map[string]any)
		want string
	}{
		{func(s map[string]any) { sub(s, "ingress")["className"] = "nginx" },
			"spec.ingress.className: nginx is not supported by the Kyma module: the tunnel is exposed through the Istio ingress gateway (Kyma's Istio module)"},
		{func(s map[string]any) { sub(s, "ingress")["tls"] = map[string]any{"secretName": "kube-system/x"} },
			`spec.ingress.tls.secretName: "kube-system/x" names another namespace`},
		{func(s map[string]any) {
			sub(sub(s, "secretConfig"), "integration")["connectivityService"] = map[string]any{"secretName": "connectivity-proxy-webhook-ca"}
		}, `spec.secretConfig.integration.connectivityService.secretName: "connectivity-proxy-webhook-ca" is one of the operator's own Secrets`},
		{func(s map[string]any) { sub(s, "ingress")["tls"] = map[string]any{"secretName": "Bad_Name"} },
			`"Bad_Name" is not a valid Secret name`},
		{func(s map[string]any) {
			sub(sub(sub(s, "config"), "servers"), "businessDataTunnel")["externalHost"] = strings.Repeat("h", 65)
		},
			"spec.config.servers.businessDataTunnel.externalHost: 65 characters is longer than the 64-character certificate common-name limit"},
		{func(s map[string]any) {
			sub(sub(sub(s, "config"), "servers"), "businessDataTunnel")["externalHost"] = " "
		},
			"externalHost: must not be empty"},
		{func(s map[string]any) { delete(sub(s, "config"), "subaccountId") },
			"spec.config.subaccountId: required when spec.config.tenantMode is dedicated"},
		{func(s map[string]any) { delete(sub(s, "config"), "subaccountSubdomain") },
			"spec.config.subaccountSubdomain: required because spec.config.servers.proxy.http.enableProxyAuthorization is false"},
		{func(s map[string]any) {
			sub(sub(s, "config"), "servers")["proxy"] = map[string]any{
				"http":       map[string]any{"enabled": false},
				"rfcAndLdap": map[string]any{"enableProxyAuthorization": true},
			}
		}, "spec.config.servers.proxy.authorization.oauth.allowedClientId: required because spec.config.servers.proxy.rfcAndLdap.enableProxyAuthorization is true"},
	}
	for _, c := range cases {
		cr := defaultedCR(t)
		c.edit(spec(cr))
		wantDenied(t, v.decide(review(t, admissionv1.Create, "alice", cr, nil)), 422, c.want)
	}

	// The rule needing the old spec: the service-key secret cannot be renamed while secretData is set.
	old := defaultedCR(t)
	sub(sub(spec(old), "secretConfig"), "integration")["connectivityService"] = map[string]any{"secretName": "a", "secretData": "eA=="}
	nw := deepCopy(t, old)
	sub(sub(sub(spec(nw), "secretConfig"), "integration"), "connectivityService")["secretName"] = "b"
	wantDenied(t, v.decide(review(t, admissionv1.Update, "alice", nw, old)), 422,
		`cannot change from "a" to "b" while secretData is set; remove secretData first`)
}

// metadata_only_updates_and_deletion_are_judged_only_by_the_protected_fields, plus the bench's
// label update.
func TestMetadataOnlyUpdate(t *testing.T) {
	v := testValidator(t)
	wantAllowed(t, v.decide(request(t, "testdata/bench-validate-update.json")))

	// A CR stored before a rule existed: dedicated tenant mode without a subaccount id.
	stored := defaultedCR(t)
	sub(spec(stored), "config")["subaccountId"] = nil
	sub(spec(stored), "config")["tenantMode"] = "dedicated"
	edited := deepCopy(t, stored)
	sub(spec(edited), "config")["subaccountSubdomain"] = "other"
	wantDenied(t, v.decide(review(t, admissionv1.Update, "alice", edited, stored)), 422, "spec.config.subaccountId")

	unfinalized := deepCopy(t, stored)
	sub(unfinalized, "metadata")["finalizers"] = []any{}
	sub(unfinalized, "metadata")["labels"] = map[string]any{"team": "a"}
	wantAllowed(t, v.decide(review(t, admissionv1.Update, "alice", unfinalized, stored)))

	// The same spec in other bytes (key order, spacing) is still a metadata-only update.
	req := review(t, admissionv1.Update, "alice", unfinalized, stored)
	req.Object.Raw = bytes.Replace(req.Object.Raw, []byte(`"config":{`), []byte(`"config": {`), 1)
	wantAllowed(t, v.decide(req))

	deleting := deepCopy(t, stored)
	sub(deleting, "metadata")["deletionTimestamp"] = "2026-11-30T12:00:00Z"
	sub(spec(deleting), "config")["subaccountSubdomain"] = "other"
	wantAllowed(t, v.decide(review(t, admissionv1.Update, "alice", deleting, stored)))
	sub(spec(deleting), "deployment")["replicaCount"] = 7
	wantDenied(t, v.decide(review(t, admissionv1.Update, "alice", deleting, stored)), 403, "spec.deployment.replicaCount")

	// Warnings only when the spec is written.
	cr := defaultedCR(t)
	sub(spec(cr), "ingress")["annotations"] = map[string]any{"nginx.ingress.kubernetes.io/x": "y"}
	resp := v.decide(review(t, admissionv1.Create, "alice", cr, nil))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.HasPrefix(resp.Warnings[0], "spec.ingress.annotations") {
		t.Fatalf("got %+v", resp)
	}
	labelled := deepCopy(t, cr)
	sub(labelled, "metadata")["labels"] = map[string]any{"team": "a"}
	if resp = v.decide(review(t, admissionv1.Update, "alice", labelled, cr)); !resp.Allowed || resp.Warnings != nil {
		t.Fatalf("got %+v", resp)
	}
}

func TestOutsideModuleNamespaceWarning(t *testing.T) {
	v := testValidator(t)
	req := review(t, admissionv1.Create, "alice", defaultedCR(t), nil)
	if resp := v.decide(req); !resp.Allowed || resp.Warnings != nil {
		t.Fatalf("got %+v", resp)
	}
	req.Namespace = "team-a"
	resp := v.decide(req)
	if !resp.Allowed || len(resp.Warnings) != 1 || resp.Warnings[0] != "ConnectivityProxy team-a/connectivity-proxy: the operator installs "+
		"the Connectivity Proxy only from a ConnectivityProxy in kyma-system; this one will report state Warning "+
		"(OutsideModuleNamespace) and install nothing" {
		t.Fatalf("got %+v", resp)
	}
}

func TestKindOperationAndBadInput(t *testing.T) {
	v, m := testValidator(t), &mutator{defaults: testDefaults(t)}
	req := review(t, admissionv1.Create, "alice", defaultCR(t), nil)
	req.Kind.Kind = "ServiceMapping"
	wantDenied(t, v.decide(req), 400, "this endpoint admits ConnectivityProxy.connectivityproxy.sap.com, not ServiceMapping.connectivityproxy.sap.com")
	wantDenied(t, m.decide(req), 400, "not ServiceMapping")
	req = review(t, admissionv1.Delete, "alice", defaultCR(t), nil)
	wantAllowed(t, v.decide(req))
	wantAllowed(t, m.decide(req))
	req = review(t, admissionv1.Create, "alice", defaultCR(t), nil)
	req.Object.Raw = nil
	wantDenied(t, v.decide(req), 400, "AdmissionRequest has no object")
	wantDenied(t, m.decide(req), 400, "AdmissionRequest has no object")
	nw := defaultedCR(t)
	sub(spec(nw), "config")["tenantMode"] = "shared"
	req = review(t, admissionv1.Update, "alice", nw, nil)
	wantDenied(t, v.decide(req), 400, "AdmissionRequest has no oldObject")
	req = review(t, admissionv1.Update, "alice", nw, map[string]any{"metadata": map[string]any{}})
	wantDenied(t, v.decide(req), 422, "oldObject has no spec")
	req = review(t, admissionv1.Create, "alice", map[string]any{"metadata": map[string]any{"name": 5}}, nil)
	wantDenied(t, v.decide(req), 400, "object is not a valid object")
}

func TestRustDebugQuoting(t *testing.T) {
	for in, want := range map[string]string{
		`a"b\c`:  `"a\"b\\c"`,
		"t\tn\n": `"t\tn\n"`,
		"x\x01":  `"x\u{1}"`,
		"it's":   `"it's"`,
		"é":      `"é"`,
	} {
		if got := rustDebug(in); got != want {
			t.Errorf("rustDebug(%q) = %s, want %s", in, got, want)
		}
	}
}

// logLines runs n requests through controller-runtime's Webhook.Handle with a logger built from
// the zap flags and returns the log lines.
func logLines(t *testing.T, h admission.Handler, req admission.Request, n int, flags ...string) []string {
	t.Helper()
	var out bytes.Buffer
	opts := crzap.Options{DestWriter: &out}
	flagSet(t, &opts, flags...)
	log := newLogger(opts, false).WithName("admission")
	wh := &admission.Webhook{
		Handler:        h,
		LogConstructor: func(logr.Logger, *admission.Request) logr.Logger { return log },
	}
	for range n {
		if resp := wh.Handle(context.Background(), req); resp.Result == nil || resp.UID != req.UID {
			t.Fatalf("got %+v", resp)
		}
	}
	if out.Len() == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
}

func wantLogLine(t *testing.T, line string, want map[string]any) {
	t.Helper()
	var got map[string]any
	if err := json.Unmarshal([]byte(line), &got); err != nil {
		t.Fatalf("%v: %s", err, line)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %v in %s", k, got[k], w, line)
		}
	}
	if _, ok := got["ts"]; !ok || len(got) != len(want)+1 {
		t.Errorf("fields: %s", line)
	}
}

// Logging as webhook/src/server.rs: every decision has one JSON line with the Rust webhook's
// fields, a denial at info, an admitted request at debug (at info with --log-admitted-at-info);
// no sampling drops any.
func TestDecisionLogLines(t *testing.T) {
	const n = 300 // more than controller-runtime's sampler lets through per second
	info := []string{"--zap-log-level=info", "--zap-encoder=json"}
	mutate := request(t, "testdata/bench-mutate-create.json")
	patchedLine := map[string]any{
		"level": "info", "logger": "admission", "msg": "admission decision", "endpoint": "mutate",
		"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "user": "alice", "operation": "CREATE",
		"namespace": "kyma-system", "name": "connectivity-proxy", "decision": "patched", "reason": "",
	}

	lines := logLines(t, &mutator{defaults: testDefaults(t), logAdmittedAtInfo: true}, mutate, n, info...)
	if len(lines) != n {
		t.Fatalf("%d lines for %d requests", len(lines), n)
	}
	wantLogLine(t, lines[0], patchedLine)

	if lines = logLines(t, &mutator{defaults: testDefaults(t)}, mutate, n, info...); len(lines) != 0 {
		t.Fatalf("admitted requests logged at info: %s", lines[0])
	}
	lines = logLines(t, &mutator{defaults: testDefaults(t)}, mutate, n, "--zap-log-level=debug", "--zap-encoder=json")
	if len(lines) != n {
		t.Fatalf("%d lines for %d requests", len(lines), n)
	}
	patchedLine["level"] = "debug"
	wantLogLine(t, lines[0], patchedLine)

	denied := request(t, "testdata/validate-update-replicas.json")
	lines = logLines(t, testValidator(t), denied, n, info...)
	if len(lines) != n {
		t.Fatalf("%d lines for %d denials", len(lines), n)
	}
	wantLogLine(t, lines[0], map[string]any{
		"level": "info", "logger": "admission", "msg": "admission decision", "endpoint": "validate",
		"uid": "00000000-0000-0000-0000-000000000002", "user": "alice", "operation": "UPDATE",
		"namespace": "kyma-system", "name": "connectivity-proxy", "decision": "denied",
		"reason": "spec.deployment is managed by the Connectivity Proxy operator and cannot be changed by alice: " +
			"refused spec.deployment.replicaCount. Only user " + controllerSA + " may change it; " +
			"edit spec.config, spec.ingress or spec.secretConfig instead",
	})

	if lines = logLines(t, testValidator(t), denied, 1, "--zap-log-level=error"); len(lines) != 0 {
		t.Fatalf("logged at error level: %s", lines[0])
	}
}

func newFlagSet() *flag.FlagSet { return flag.NewFlagSet("test", flag.ContinueOnError) }

// flagSet parses args into opts as main does.
func flagSet(t *testing.T, opts *crzap.Options, args ...string) {
	t.Helper()
	fs := newFlagSet()
	opts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
}

func TestPprofOnLoopbackOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := startPprof(ctx, "0.0.0.0:0"); err == nil {
		t.Fatal("non-loopback address accepted")
	}
	if _, err := startPprof(ctx, ":0"); err == nil {
		t.Fatal("wildcard address accepted")
	}
	addr, err := startPprof(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("goroutine profile")) {
		t.Fatalf("%d: %.200s", resp.StatusCode, body)
	}
}

func TestMutateSpecNotAnObject(t *testing.T) {
	m := &mutator{defaults: testDefaults(t)}
	for _, s := range []any{"x", 5, []any{1}, true, nil} {
		cr := defaultCR(t)
		cr["spec"] = s
		wantDenied(t, m.decide(review(t, admissionv1.Create, "alice", cr, nil)), 422, "object has no spec")
		wantDenied(t, testValidator(t).decide(review(t, admissionv1.Create, "alice", cr, nil)), 422, "object has no spec")
	}
	cr := defaultCR(t)
	sub(cr, "metadata")["name"] = 5
	wantDenied(t, m.decide(review(t, admissionv1.Create, "alice", cr, nil)), 400, "object is not a valid object")
}
