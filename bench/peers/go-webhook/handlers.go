package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// The handlers reproduce webhook/src/admission/mod.rs (review, mutate, validate_cp,
// metadata_only_or_deleting, protected_fields, outside_module_namespace) for ConnectivityProxy.

const (
	group = "connectivityproxy.sap.com"
	kind  = "ConnectivityProxy"
)

var jsonPatchType = admissionv1.PatchTypeJSONPatch

// deny is a refusal carrying the same status fields as the Rust webhook's.
func deny(code int32, reason metav1.StatusReason, message string) admission.Response {
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result: &metav1.Status{
			Status:  metav1.StatusFailure,
			Code:    code,
			Reason:  reason,
			Message: message,
		},
	}}
}

func invalid(message string) admission.Response {
	return deny(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, message)
}

func badRequest(message string) admission.Response {
	return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, message)
}

// allowed is an allowed answer; Webhook.Handle (Response.Complete) adds the UID and code 200.
func allowed() admission.Response {
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true}}
}

// patched is an allowed answer carrying a finished JSON patch. Setting Patch (not Patches)
// skips controller-runtime's marshalling of []JsonPatchOperation; the bytes are shared and only read.
func patched(patch []byte) admission.Response {
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: true, Patch: patch, PatchType: &jsonPatchType,
	}}
}

// precheck answers the requests both endpoints treat alike: another kind is refused, and
// operations other than CREATE and UPDATE are allowed untouched. done=false means "decide".
func precheck(req admission.Request) (resp admission.Response, done bool) {
	if req.Kind.Kind != kind || req.Kind.Group != group {
		return badRequest(fmt.Sprintf(
			"this endpoint admits %s.%s, not %s.%s; check the webhook configuration's rules",
			kind, group, req.Kind.Kind, req.Kind.Group)), true
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return allowed(), true
	}
	return admission.Response{}, false
}

// decodeObject decodes req.Object or req.OldObject: typed metadata, raw spec. In Rust an
// undecodable object fails the whole AdmissionReview (HTTP 400); here it is a 400 denial.
func decodeObject(raw []byte, which string) (*cpObject, *admission.Response) {
	if len(raw) == 0 {
		r := badRequest("AdmissionRequest has no " + which)
		return nil, &r
	}
	obj := new(cpObject)
	if err := json.Unmarshal(raw, obj); err != nil {
		r := badRequest(fmt.Sprintf("%s is not a valid object: %v", which, err))
		return nil, &r
	}
	return obj, nil
}

// isJSONObject reports whether raw JSON is an object (Rust: spec_json's is_object filter).
func isJSONObject(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	return len(raw) > 0 && raw[0] == '{'
}

func isJSONNull(raw json.RawMessage) bool {
	return string(bytes.TrimSpace(raw)) == "null"
}

// deploymentOfSpec is spec.deployment of a raw spec as generic JSON, nil when absent, null or
// when the spec is not an object (Rust: deployment_of).
func deploymentOfSpec(spec json.RawMessage) any {
	if !isJSONObject(spec) {
		return nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(spec, &fields); err != nil {
		return nil
	}
	raw, ok := fields["deployment"]
	if !ok {
		return nil
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return nil
	}
	return v
}

// logDecision logs the decision with the Rust webhook's "admission decision" fields
// (webhook/src/server.rs log_decision): a denial at info, an allowed or patched request at debug
// (V(1)), or at info too with admittedAtInfo. The fields are built only when the line is enabled
// (the Rust side checks its level first too).
func logDecision(ctx context.Context, endpoint string, admittedAtInfo bool, req admission.Request,
	resp admission.Response) admission.Response {
	log := logf.FromContext(ctx)
	if resp.Allowed && !admittedAtInfo {
		log = log.V(1)
	}
	if !log.Enabled() {
		return resp
	}
	decision := "allowed"
	switch {
	case !resp.Allowed:
		decision = "denied"
	case len(resp.Patch) > 0 || len(resp.Patches) > 0:
		decision = "patched"
	}
	reason := ""
	if resp.Result != nil {
		reason = resp.Result.Message
	}
	log.Info("admission decision",
		"endpoint", endpoint,
		"uid", string(req.UID),
		"user", req.UserInfo.Username,
		"operation", string(req.Operation),
		"namespace", req.Namespace,
		"name", req.Name,
		"decision", decision,
		"reason", reason)
	return resp
}

// mutator fills missing spec.deployment fields with the release defaults (/mutate).
type mutator struct {
	defaults *releaseDefaults
	// logAdmittedAtInfo logs allowed and patched requests at info, not debug.
	logAdmittedAtInfo bool
}

var _ admission.Handler = &mutator{}

func (m *mutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return logDecision(ctx, "mutate", m.logAdmittedAtInfo, req, m.decide(req))
}

// decide is mod.rs mutate: one "add" of the whole defaults when spec.deployment is absent (the
// usual create), one "replace" when it is null, otherwise the operations filling only the
// missing fields, or no patch when nothing is missing (the usual update).
func (m *mutator) decide(req admission.Request) admission.Response {
	if resp, done := precheck(req); done {
		return resp
	}
	if len(req.Object.Raw) == 0 {
		return badRequest("AdmissionRequest has no object")
	}
	// One pass: the metadata typed, spec.deployment kept raw (absent, null or a value).
	var obj struct {
		Metadata objectMeta `json:"metadata"`
		Spec     *struct {
			Deployment json.RawMessage `json:"deployment"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(req.Object.Raw, &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field == "spec" {
			return invalid("object has no spec") // a spec that is not an object
		}
		return badRequest(fmt.Sprintf("object is not a valid object: %v", err))
	}
	if obj.Spec == nil {
		return invalid("object has no spec")
	}
	spec := obj.Spec
	switch {
	case spec.Deployment == nil:
		return patched(m.defaults.addPatch)
	case isJSONNull(spec.Deployment):
		return patched(m.defaults.replacePatch)
	case !isJSONObject(spec.Deployment):
		return allowed() // fill_missing leaves a non-object alone
	}
	current, err := decodeJSON(spec.Deployment)
	if err != nil {
		return deny(http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error())
	}
	if patch := m.defaults.fillPatch(current.(map[string]any)); patch != nil {
		return patched(patch)
	}
	return allowed()
}

// validator validates ConnectivityProxy writes (/validate): protected fields, typed spec without
// unknown fields, cross-field rules, warnings.
type validator struct {
	defaults   *releaseDefaults
	privileged privileged
	// logAdmittedAtInfo logs allowed requests at info, not debug.
	logAdmittedAtInfo bool
}

var _ admission.Handler = &validator{}

func (v *validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return logDecision(ctx, "validate", v.logAdmittedAtInfo, req, v.decide(req))
}

// decide is mod.rs review for Endpoint::Validate: validate_cp, then the warnings.
func (v *validator) decide(req admission.Request) admission.Response {
	if resp, done := precheck(req); done {
		return resp
	}
	newObj, errResp := decodeObject(req.Object.Raw, "object")
	if errResp != nil {
		return *errResp
	}
	update := req.Operation == admissionv1.Update
	// In Rust the whole review, oldObject included, is decoded before anything is decided.
	var oldObj *cpObject
	if update && len(req.OldObject.Raw) > 0 {
		if oldObj, errResp = decodeObject(req.OldObject.Raw, "oldObject"); errResp != nil {
			return *errResp
		}
	}
	if !isJSONObject(newObj.Spec) {
		return invalid("object has no spec")
	}
	var oldSpecRaw json.RawMessage // nil: no oldObject or no spec in it
	if oldObj != nil {
		oldSpecRaw = oldObj.Spec
	}
	if update && (newObj.Metadata.DeletionTimestamp != nil || specsEqual(oldSpecRaw, newObj.Spec)) {
		// metadata_only_or_deleting: labels, annotations, finalizers of a CR stored under older
		// rules, or a CR on its way out: only the protected-field check applies.
		if resp, denied := v.protectedFields(req, oldSpecRaw, oldSpecRaw != nil, newObj.Spec); denied {
			return resp
		}
		return allowed()
	}
	spec, msg := decodeSpecStrict(newObj.Spec, "object")
	if spec == nil {
		return invalid(msg)
	}
	var oldSpec *cpSpec
	if update {
		if oldObj == nil {
			return badRequest("AdmissionRequest has no oldObject")
		}
		if !isJSONObject(oldSpecRaw) {
			return invalid("oldObject has no spec")
		}
		// The stored object was admitted before: only what the rules about a change read
		// (spec.secretConfig, spec.config.serviceChannels) is parsed, as cp-webhook's `Stored` does.
		if oldSpec, msg = decodeStoredSpec(oldSpecRaw, "oldObject"); oldSpec == nil {
			return invalid(msg)
		}
	}
	if resp, denied := v.protectedFields(req, oldSpecRaw, update, newObj.Spec); denied {
		return resp
	}
	// The peer has no API server to list ServiceMappings from: the rule needing them never fires.
	if errs := spec.validate(oldSpec, clusterFacts{}); len(errs) > 0 {
		return invalid(fmt.Sprintf("ConnectivityProxy %s is invalid: %s", req.Name, joinErrors(errs)))
	}
	resp := allowed()
	if req.Operation == admissionv1.Create && req.Namespace != kymaSystem {
		resp.Warnings = append(resp.Warnings, fmt.Sprintf(
			"ConnectivityProxy %s/%s: the operator installs the Connectivity Proxy only from a ConnectivityProxy in %s; "+
				"this one will report state Warning (OutsideModuleNamespace) and install nothing",
			req.Namespace, req.Name, kymaSystem))
	}
	resp.Warnings = append(resp.Warnings, ignoredFields(spec)...)
	return resp
}

// specsEqual is serde_json Value equality of the old spec (nil: none) and the new one. The API
// server encodes both objects alike, so equal specs are equal bytes; other bytes are compared as
// JSON values.
func specsEqual(oldSpec, newSpec json.RawMessage) bool {
	if oldSpec == nil {
		return false
	}
	if bytes.Equal(oldSpec, newSpec) {
		return true
	}
	a, err1 := decodeJSON(oldSpec)
	b, err2 := decodeJSON(newSpec)
	return err1 == nil && err2 == nil && jsonEqual(a, b)
}

// protectedFields refuses a change of spec.deployment by anyone but the privileged identities.
// hasOld=false compares against the release defaults (CREATE, or no old spec).
func (v *validator) protectedFields(req admission.Request, oldSpec json.RawMessage, hasOld bool,
	newSpec json.RawMessage) (admission.Response, bool) {
	user := req.UserInfo.Username
	if v.privileged.allows(user, req.UserInfo.Groups) {
		return admission.Response{}, false
	}
	if hasOld && bytes.Equal(oldSpec, newSpec) {
		return admission.Response{}, false // same bytes: nothing in spec.deployment changed
	}
	if hasOld {
		// The text of spec.deployment, compared before anything is decoded into values, as
		// cp-webhook compares it (the API server encodes both objects alike).
		if a, b := deploymentText(oldSpec), deploymentText(newSpec); a != nil && bytes.Equal(a, b) {
			return admission.Response{}, false
		}
	}
	var before any = v.defaults.value
	if hasOld {
		before = deploymentOfSpec(oldSpec)
	}
	changed := changedPaths(before, deploymentOfSpec(newSpec))
	if len(changed) == 0 {
		return admission.Response{}, false
	}
	return deny(http.StatusForbidden, metav1.StatusReasonForbidden, fmt.Sprintf(
		"spec.deployment is managed by the Connectivity Proxy operator and cannot be changed by %s: "+
			"refused %s. Only %s may change it; edit spec.config, spec.ingress or spec.secretConfig instead",
		user, strings.Join(changed, ", "), v.privileged.describe())), true
}

// deploymentText is the raw text of spec.deployment (nil when absent or the spec is not an object).
func deploymentText(spec json.RawMessage) json.RawMessage {
	var d struct {
		Deployment json.RawMessage `json:"deployment"`
	}
	if json.Unmarshal(spec, &d) != nil {
		return nil
	}
	return d.Deployment
}
