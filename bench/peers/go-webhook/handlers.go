package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	group = "connectivityproxy.sap.com"
	kind  = "ConnectivityProxy"
)

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

// precheck answers the requests both endpoints treat alike: another kind is refused, and
// operations other than CREATE and UPDATE are allowed untouched. ok=false means "decide".
func precheck(req admission.Request) (admission.Response, bool) {
	if req.Kind.Kind != kind || req.Kind.Group != group {
		return deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf(
			"this endpoint admits %s.%s, not %s.%s; check the webhook configuration's rules",
			kind, group, req.Kind.Kind, req.Kind.Group)), true
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed(""), true
	}
	return admission.Response{}, false
}

// objectOf decodes req.Object or req.OldObject as unstructured JSON.
func objectOf(raw []byte, which string) (any, *admission.Response) {
	if len(raw) == 0 {
		r := deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, "AdmissionRequest has no "+which)
		return nil, &r
	}
	v, err := decodeJSON(raw)
	if err != nil {
		r := deny(http.StatusBadRequest, metav1.StatusReasonBadRequest, fmt.Sprintf("%s is not valid JSON: %v", which, err))
		return nil, &r
	}
	return v, nil
}

// logDecision logs one line per request, like the Rust webhook's "admission decision" at info.
// The context logger already carries the request's object, user and requestID.
func logDecision(ctx context.Context, endpoint string, req admission.Request, resp admission.Response) admission.Response {
	decision := "allowed"
	switch {
	case !resp.Allowed:
		decision = "denied"
	case len(resp.Patches) > 0:
		decision = "patched"
	}
	reason := ""
	if resp.Result != nil {
		reason = resp.Result.Message
	}
	logf.FromContext(ctx).Info("admission decision",
		"endpoint", endpoint, "operation", string(req.Operation), "decision", decision, "reason", reason)
	return resp
}

// mutator fills missing spec.deployment fields with the release defaults (/mutate).
type mutator struct {
	// defaults is the complete spec.deployment value, decoded once; never modified.
	defaults map[string]any
}

var _ admission.Handler = &mutator{}

func (m *mutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return logDecision(ctx, "mutate", req, m.decide(req))
}

func (m *mutator) decide(req admission.Request) admission.Response {
	if resp, done := precheck(req); done {
		return resp
	}
	obj, errResp := objectOf(req.Object.Raw, "object")
	if errResp != nil {
		return *errResp
	}
	root, _ := obj.(map[string]any)
	spec, ok := root["spec"].(map[string]any)
	if !ok {
		return deny(http.StatusUnprocessableEntity, metav1.StatusReasonInvalid, "object has no spec")
	}
	// obj was decoded from req.Object.Raw, which stays untouched as the patch's original.
	changed := true
	if cur, present := spec["deployment"]; present && cur != nil {
		changed = fillMissing(cur, m.defaults)
	} else {
		spec["deployment"] = deepCopy(m.defaults)
	}
	if !changed {
		return admission.Allowed("")
	}
	mutated, err := json.Marshal(obj)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, mutated)
}

// validator refuses changes to spec.deployment by non-privileged users (/validate).
type validator struct {
	defaults   map[string]any
	privileged privileged
}

var _ admission.Handler = &validator{}

func (v *validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return logDecision(ctx, "validate", req, v.decide(req))
}

func (v *validator) decide(req admission.Request) admission.Response {
	if resp, done := precheck(req); done {
		return resp
	}
	newObj, errResp := objectOf(req.Object.Raw, "object")
	if errResp != nil {
		return *errResp
	}
	var before any = v.defaults
	if req.Operation == admissionv1.Update {
		oldObj, errResp := objectOf(req.OldObject.Raw, "oldObject")
		if errResp != nil {
			return *errResp
		}
		before = deploymentOf(oldObj)
	}
	user := req.UserInfo.Username
	if !v.privileged.allows(user, req.UserInfo.Groups) {
		if changed := changedPaths(before, deploymentOf(newObj)); len(changed) > 0 {
			return deny(http.StatusForbidden, metav1.StatusReasonForbidden, fmt.Sprintf(
				"spec.deployment is managed by the Connectivity Proxy operator and cannot be changed by %s: "+
					"refused %s. Only %s may change it; edit spec.config, spec.ingress or spec.secretConfig instead",
				user, strings.Join(changed, ", "), v.privileged.describe()))
		}
	}
	return admission.Allowed("")
}
