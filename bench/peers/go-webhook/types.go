package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cpObject is what the webhook reads of a ConnectivityProxy: the two metadata fields the rules
// use and the spec as raw JSON (decoded further by whoever needs it). Other fields (apiVersion,
// kind, the rest of the metadata, status) are skipped, as the Rust webhook skips them: it reads
// only metadata.name and metadata.deletionTimestamp and refuses unknown fields only in the spec.
type cpObject struct {
	Metadata objectMeta      `json:"metadata"`
	Spec     json.RawMessage `json:"spec"`
}

// objectMeta is the metadata the rules read (the Rust webhook's admission::ObjectMeta).
type objectMeta struct {
	Name              string       `json:"name,omitempty"`
	DeletionTimestamp *metav1.Time `json:"deletionTimestamp,omitempty"`
}

// The typed spec mirrors shared/src/cp.rs field for field. Rust `Option<T>` is a pointer with
// omitempty (absent and null are both None there); a required Rust field (`String`, a struct,
// `bool`) is a pointer without omitempty, so that a missing one is detected (missing()) as serde
// reports it. Maps and lists are `Option<BTreeMap>`/`Option<Vec>` in Rust: no omitempty, so that
// an empty one survives the round trip unknownFields compares against. Go fields are declared in
// the JSON keys' sorted order, the order serde_json (BTreeMap) visits them in.

type cpSpec struct {
	Config       *cpConfig     `json:"config"`
	Deployment   *deployment   `json:"deployment,omitempty"`
	Ingress      *ingress      `json:"ingress,omitempty"`
	SecretConfig *secretConfig `json:"secretConfig,omitempty"`
}

type cpConfig struct {
	HighAvailabilityMode *string          `json:"highAvailabilityMode,omitempty"`
	Integration          *integration     `json:"integration,omitempty"`
	MultiRegionMode      *multiRegionMode `json:"multiRegionMode,omitempty"`
	Servers              *servers         `json:"servers"`
	ServiceChannels      *serviceChannels `json:"serviceChannels,omitempty"`
	SubaccountID         *string          `json:"subaccountId,omitempty"`
	SubaccountSubdomain  *string          `json:"subaccountSubdomain,omitempty"`
	TenantMode           *string          `json:"tenantMode,omitempty"`
}

type integration struct {
	Auditlog            *auditlog                       `json:"auditlog,omitempty"`
	ConnectivityService *connectivityServiceIntegration `json:"connectivityService,omitempty"`
}

type auditlog struct {
	Mode                  *string `json:"mode,omitempty"`
	ServiceCredentialsKey *string `json:"serviceCredentialsKey,omitempty"`
}

type connectivityServiceIntegration struct {
	ServiceCredentialsKey *string `json:"serviceCredentialsKey,omitempty"`
}

type multiRegionMode struct {
	ConfigMapName *string `json:"configMapName,omitempty"`
	Enabled       *bool   `json:"enabled,omitempty"`
}

type serviceChannels struct {
	Enabled *bool `json:"enabled,omitempty"`
}

type servers struct {
	BusinessDataTunnel *businessDataTunnel `json:"businessDataTunnel"`
	Proxy              *proxies            `json:"proxy,omitempty"`
}

type businessDataTunnel struct {
	ExternalHost *string `json:"externalHost"`
	ExternalPort *int32  `json:"externalPort,omitempty"`
}

type proxies struct {
	Authorization *authorization `json:"authorization,omitempty"`
	HTTP          *proxyServer   `json:"http,omitempty"`
	RfcAndLdap    *proxyServer   `json:"rfcAndLdap,omitempty"`
	Socks5        *proxyServer   `json:"socks5,omitempty"`
}

type authorization struct {
	OAuth *oauth `json:"oauth"`
}

type oauth struct {
	AllowedClientID *string `json:"allowedClientId"`
}

type proxyServer struct {
	AllowRemoteConnections   *bool  `json:"allowRemoteConnections,omitempty"`
	EnableProxyAuthorization *bool  `json:"enableProxyAuthorization,omitempty"`
	Enabled                  *bool  `json:"enabled,omitempty"`
	Port                     *int32 `json:"port,omitempty"`
}

type deployment struct {
	Image          *image            `json:"image,omitempty"`
	NodeSelector   map[string]string `json:"nodeSelector"`
	ReplicaCount   *int32            `json:"replicaCount,omitempty"`
	Resources      *resources        `json:"resources,omitempty"`
	RestartWatcher *restartWatcher   `json:"restartWatcher,omitempty"`
	UtilityImage   *image            `json:"utilityImage,omitempty"`
}

type image struct {
	Digest     *string `json:"digest,omitempty"`
	PullPolicy *string `json:"pullPolicy,omitempty"`
	PullSecret *string `json:"pullSecret,omitempty"`
	Registry   *string `json:"registry"`
	Repository *string `json:"repository"`
	Tag        *string `json:"tag"`
}

type resources struct {
	Limits                 *cpuMemory `json:"limits,omitempty"`
	MaxFileDescriptorCount *int64     `json:"maxFileDescriptorCount,omitempty"`
	Requests               *cpuMemory `json:"requests,omitempty"`
}

type cpuMemory struct {
	CPU    *string `json:"cpu"`
	Memory *string `json:"memory"`
}

type restartWatcher struct {
	Enabled *bool `json:"enabled"`
}

type ingress struct {
	Annotations map[string]string `json:"annotations"`
	ClassName   *string           `json:"className,omitempty"`
	Istio       *istioIngress     `json:"istio,omitempty"`
	Timeouts    *timeouts         `json:"timeouts,omitempty"`
	TLS         *ingressTLS       `json:"tls,omitempty"`
}

type istioIngress struct {
	Gateway   *istioGateway `json:"gateway,omitempty"`
	Namespace *string       `json:"namespace,omitempty"`
	TLS       *istioTLS     `json:"tls,omitempty"`
}

type istioGateway struct {
	Selector map[string]string `json:"selector"`
}

type istioTLS struct {
	Ciphers []string `json:"ciphers"`
}

type timeouts struct {
	Proxy *proxyTimeouts `json:"proxy,omitempty"`
}

type proxyTimeouts struct {
	Connect *int64 `json:"connect,omitempty"`
	Read    *int64 `json:"read,omitempty"`
	Send    *int64 `json:"send,omitempty"`
}

type ingressTLS struct {
	SecretName *string `json:"secretName"`
}

type secretConfig struct {
	Integration *secretIntegration `json:"integration,omitempty"`
}

type secretIntegration struct {
	AuditlogService     *serviceSecret             `json:"auditlogService,omitempty"`
	ConnectivityService *connectivityServiceSecret `json:"connectivityService,omitempty"`
}

type serviceSecret struct {
	SecretData *string `json:"secretData,omitempty"`
	SecretName *string `json:"secretName"`
}

type connectivityServiceSecret struct {
	SecretData *string `json:"secretData,omitempty"`
	SecretName *string `json:"secretName,omitempty"`
}

// missing returns the first required field serde would report as missing ("missing field"),
// in serde's order: present fields are visited in key order and a nested error wins; then the
// struct's own required fields in declaration order. "" when complete.
func (s *cpSpec) missing() string {
	if s.Config != nil {
		if m := s.Config.missing(); m != "" {
			return m
		}
	}
	if s.Deployment != nil {
		if m := s.Deployment.missing(); m != "" {
			return m
		}
	}
	if s.Ingress != nil && s.Ingress.TLS != nil && s.Ingress.TLS.SecretName == nil {
		return "secretName"
	}
	if s.SecretConfig != nil && s.SecretConfig.Integration != nil {
		if a := s.SecretConfig.Integration.AuditlogService; a != nil && a.SecretName == nil {
			return "secretName"
		}
	}
	if s.Config == nil {
		return "config"
	}
	return ""
}

func (c *cpConfig) missing() string {
	if c.Servers == nil {
		return "servers"
	}
	s := c.Servers
	if s.BusinessDataTunnel != nil && s.BusinessDataTunnel.ExternalHost == nil {
		return "externalHost"
	}
	if s.Proxy != nil && s.Proxy.Authorization != nil {
		if s.Proxy.Authorization.OAuth == nil {
			return "oauth"
		}
		if s.Proxy.Authorization.OAuth.AllowedClientID == nil {
			return "allowedClientId"
		}
	}
	if s.BusinessDataTunnel == nil {
		return "businessDataTunnel"
	}
	return ""
}

func (d *deployment) missing() string {
	if m := d.Image.missing(); m != "" {
		return m
	}
	if r := d.Resources; r != nil {
		if m := r.Limits.missing(); m != "" {
			return m
		}
		if m := r.Requests.missing(); m != "" {
			return m
		}
	}
	if d.RestartWatcher != nil && d.RestartWatcher.Enabled == nil {
		return "enabled"
	}
	return d.UtilityImage.missing()
}

func (i *image) missing() string {
	switch {
	case i == nil:
		return ""
	case i.Registry == nil:
		return "registry"
	case i.Repository == nil:
		return "repository"
	case i.Tag == nil:
		return "tag"
	}
	return ""
}

func (c *cpuMemory) missing() string {
	switch {
	case c == nil:
		return ""
	case c.CPU == nil:
		return "cpu"
	case c.Memory == nil:
		return "memory"
	}
	return ""
}

// decodeSpecStrict parses the new object's spec into the typed spec and refuses unknown fields,
// like the Rust typed_spec: a type error or a missing required field → "object: spec: …"; unknown
// fields → "object has unknown fields: spec.a, spec.b.c". The fast path is one Decoder pass with
// DisallowUnknownFields; only a failing spec takes the slow path that builds serde's message.
func decodeSpecStrict(raw []byte, which string) (*cpSpec, string) {
	var s cpSpec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return decodeSpecSlow(raw, which)
	}
	if m := s.missing(); m != "" {
		return nil, fmt.Sprintf("%s: spec: missing field `%s`", which, m)
	}
	return &s, ""
}

// decodeSpecSlow is the refusal path of decodeSpecStrict: serde's order (a type error or a missing
// field before unknown fields), every unknown field named with its path, and an unknown field
// whose value is null accepted (serde's round trip does not see it).
func decodeSpecSlow(raw []byte, which string) (*cpSpec, string) {
	s, msg := decodeSpec(raw, which)
	if s == nil {
		return nil, msg
	}
	if unknown := unknownFields(raw, s); len(unknown) > 0 {
		return nil, fmt.Sprintf("%s has unknown fields: %s", which, strings.Join(unknown, ", "))
	}
	return s, ""
}

// decodeSpec parses a spec without the unknown-field check (the stored oldObject, as in Rust).
func decodeSpec(raw []byte, which string) (*cpSpec, string) {
	var s cpSpec
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Sprintf("%s: spec: %v", which, err)
	}
	if m := s.missing(); m != "" {
		return nil, fmt.Sprintf("%s: spec: missing field `%s`", which, m)
	}
	return &s, ""
}

// decodeStoredSpec parses only what the rules about a change read of a stored spec
// (spec.secretConfig and spec.config.serviceChannels), like cp-webhook's `Stored`: no other field is
// decoded and no required field is checked (the stored object was admitted before).
func decodeStoredSpec(raw []byte, which string) (*cpSpec, string) {
	var st struct {
		Config struct {
			ServiceChannels *serviceChannels `json:"serviceChannels,omitempty"`
		} `json:"config"`
		SecretConfig *secretConfig `json:"secretConfig,omitempty"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Sprintf("%s: spec: %v", which, err)
	}
	return &cpSpec{
		Config:       &cpConfig{ServiceChannels: st.Config.ServiceChannels},
		SecretConfig: st.SecretConfig,
	}, ""
}

// unknownFields lists the dotted paths (prefixed "spec") of the fields in raw that the typed
// round trip drops, like shared/src/validation.rs unknown_fields: keys visited in sorted order,
// null-valued unknown keys ignored, arrays walked pairwise.
func unknownFields(raw []byte, s *cpSpec) []string {
	sent, err := decodeJSON(raw)
	if err != nil {
		return nil
	}
	back, err := json.Marshal(s)
	if err != nil {
		return nil
	}
	known, err := decodeJSON(back)
	if err != nil {
		return nil
	}
	var out []string
	walkUnknown(sent, known, "spec", &out)
	return out
}

func walkUnknown(sent, known any, path string, out *[]string) {
	switch s := sent.(type) {
	case map[string]any:
		k, ok := known.(map[string]any)
		if !ok {
			return
		}
		keys := make([]string, 0, len(s))
		for key := range s {
			keys = append(keys, key)
		}
		slices.Sort(keys)
		for _, key := range keys {
			p := key
			if path != "" {
				p = path + "." + key
			}
			kv, present := k[key]
			switch {
			case !present && s[key] != nil:
				*out = append(*out, p)
			case present:
				walkUnknown(s[key], kv, p, out)
			}
		}
	case []any:
		k, ok := known.([]any)
		if !ok {
			return
		}
		for i := 0; i < len(s) && i < len(k); i++ {
			walkUnknown(s[i], k[i], path+"["+strconv.Itoa(i)+"]", out)
		}
	}
}
