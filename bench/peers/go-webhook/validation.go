package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// A port of shared/src/validation.rs (ConnectivityProxySpec::validate, ignored_fields,
// user_secret_name_problem) with the same rules, order and messages.

const (
	kymaSystem       = "kyma-system"
	autoProvision    = "auto-provision"
	secretServiceKey = "connectivity-proxy-service-key"
	maxHostLen       = 64
)

// operatorSecrets are the operator's own Secrets: a user-chosen name may never point at them.
var operatorSecrets = [...]string{
	"connectivity-proxy-webhook-cert",
	"connectivity-proxy-webhook-ca",
	"connectivity-proxy-tunnel-ca",
}

// fieldError is one validation failure.
type fieldError struct {
	field, message string
}

// joinErrors is validation::join: "field: message; field: message".
func joinErrors(errs []fieldError) string {
	var b strings.Builder
	for i, e := range errs {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(e.field)
		b.WriteString(": ")
		b.WriteString(e.message)
	}
	return b.String()
}

// clusterFacts are the facts some rules need. The peer has no API server: no ServiceMappings.
type clusterFacts struct {
	serviceMappings []string
}

// isAutoProvision is names::is_auto_provision: trimmed, ASCII case-insensitive.
func isAutoProvision(v string) bool {
	v = strings.TrimSpace(v)
	if len(v) != len(autoProvision) {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != autoProvision[i] {
			return false
		}
	}
	return true
}

func noneOrEmpty(p *string) bool { return p == nil || *p == "" }

func (s *cpSpec) tenantMode() string {
	if s.Config.TenantMode != nil {
		return *s.Config.TenantMode
	}
	return "dedicated"
}

func (s *cpSpec) serviceChannelsEnabled() bool {
	if sc := s.Config.ServiceChannels; sc != nil && sc.Enabled != nil {
		return *sc.Enabled
	}
	return true
}

func (s *cpSpec) multiRegionEnabled() bool {
	if m := s.Config.MultiRegionMode; m != nil && m.Enabled != nil {
		return *m.Enabled
	}
	return false
}

func (s *cpSpec) ingressClass() string {
	if s.Ingress != nil && s.Ingress.ClassName != nil {
		return *s.Ingress.ClassName
	}
	return "istio"
}

// effectiveProxy is one proxy with the schema defaults applied (enabled true, authorization false).
type effectiveProxy struct {
	name          string
	enabled, auth bool
}

func (s *cpSpec) proxies() [3]effectiveProxy {
	var http, rfc, socks *proxyServer
	if p := s.Config.Servers.Proxy; p != nil {
		http, rfc, socks = p.HTTP, p.RfcAndLdap, p.Socks5
	}
	eff := func(name string, p *proxyServer) effectiveProxy {
		e := effectiveProxy{name: name, enabled: true}
		if p != nil {
			if p.Enabled != nil {
				e.enabled = *p.Enabled
			}
			if p.EnableProxyAuthorization != nil {
				e.auth = *p.EnableProxyAuthorization
			}
		}
		return e
	}
	return [3]effectiveProxy{eff("http", http), eff("rfcAndLdap", rfc), eff("socks5", socks)}
}

// connectivitySecret is the Connectivity service secret's name (default
// connectivity-proxy-service-key) and data.
func (s *cpSpec) connectivitySecret() (string, *string) {
	if s.SecretConfig != nil && s.SecretConfig.Integration != nil {
		if c := s.SecretConfig.Integration.ConnectivityService; c != nil {
			name := secretServiceKey
			if c.SecretName != nil {
				name = *c.SecretName
			}
			return name, c.SecretData
		}
	}
	return secretServiceKey, nil
}

// validate checks every cross-field rule; old is the stored spec on UPDATE.
func (s *cpSpec) validate(old *cpSpec, facts clusterFacts) []fieldError {
	var errs []fieldError
	add := func(field, msg string) { errs = append(errs, fieldError{field, msg}) }
	cfg := s.Config
	dedicated := s.tenantMode() == "dedicated"
	if dedicated && noneOrEmpty(cfg.SubaccountID) {
		add("spec.config.subaccountId",
			"required when spec.config.tenantMode is dedicated; set the BTP subaccount id or auto-provision")
	}
	proxies := s.proxies()
	for _, p := range proxies {
		if p.enabled && !p.auth {
			if noneOrEmpty(cfg.SubaccountSubdomain) {
				add("spec.config.subaccountSubdomain", "required because spec.config.servers.proxy."+p.name+
					".enableProxyAuthorization is false; set the subaccount subdomain or auto-provision")
			}
			break
		}
	}
	for _, p := range proxies {
		if p.enabled && p.auth {
			var client *string
			if px := cfg.Servers.Proxy; px != nil && px.Authorization != nil {
				client = px.Authorization.OAuth.AllowedClientID
			}
			if noneOrEmpty(client) {
				add("spec.config.servers.proxy.authorization.oauth.allowedClientId",
					"required because spec.config.servers.proxy."+p.name+".enableProxyAuthorization is true")
			}
			break
		}
	}
	if s.multiRegionEnabled() {
		if noneOrEmpty(cfg.MultiRegionMode.ConfigMapName) {
			add("spec.config.multiRegionMode.configMapName", "required when multiRegionMode.enabled is true")
		}
		if s.serviceChannelsEnabled() {
			add("spec.config.serviceChannels.enabled",
				"must be false when multiRegionMode.enabled is true (multi-region mode does not support service channels)")
		}
		if dedicated {
			add("spec.config.tenantMode", "must be shared when multiRegionMode.enabled is true")
		}
	}
	host := *cfg.Servers.BusinessDataTunnel.ExternalHost
	if strings.TrimSpace(host) == "" {
		add("spec.config.servers.businessDataTunnel.externalHost",
			"must not be empty; set the tunnel host or auto-provision")
	} else if !isAutoProvision(host) && len(host) > maxHostLen {
		add("spec.config.servers.businessDataTunnel.externalHost", fmt.Sprintf(
			"%d characters is longer than the %d-character certificate common-name limit; use a shorter host",
			len(host), maxHostLen))
	}
	class := s.ingressClass()
	if class == "nginx" {
		add("spec.ingress.className",
			"nginx is not supported by the Kyma module: the tunnel is exposed through the Istio ingress gateway "+
				"(Kyma's Istio module), which verifies the Cloud Connector's client certificate; set className to istio")
	}
	var tlsName *string
	if s.Ingress != nil && s.Ingress.TLS != nil {
		tlsName = s.Ingress.TLS.SecretName
	}
	if class == "istio" && noneOrEmpty(tlsName) {
		add("spec.ingress.tls.secretName",
			"required when spec.ingress.className is istio; name a TLS secret or auto-provision")
	}
	if tlsName != nil {
		if msg := userSecretNameProblem(*tlsName); msg != "" {
			add("spec.ingress.tls.secretName", msg)
		}
	}
	newName, newData := s.connectivitySecret()
	if msg := userSecretNameProblem(newName); msg != "" {
		add("spec.secretConfig.integration.connectivityService.secretName", msg)
	}
	if old != nil {
		oldName, oldData := old.connectivitySecret()
		if oldName != newName && (oldData != nil || newData != nil) {
			add("spec.secretConfig.integration.connectivityService.secretName", fmt.Sprintf(
				"cannot change from %s to %s while secretData is set; remove secretData first",
				rustDebug(oldName), rustDebug(newName)))
		}
	}
	if !s.serviceChannelsEnabled() && (old == nil || old.serviceChannelsEnabled()) && len(facts.serviceMappings) > 0 {
		add("spec.config.serviceChannels.enabled", fmt.Sprintf(
			"cannot be disabled while ServiceMappings exist (%s); delete them first",
			strings.Join(facts.serviceMappings, ", ")))
	}
	return errs
}

// ignoredFields names accepted fields that have no effect with the Istio ingress (warnings).
func ignoredFields(s *cpSpec) []string {
	var out []string
	in := s.Ingress
	if in == nil {
		return out
	}
	if len(in.Annotations) > 0 {
		out = append(out, "spec.ingress.annotations is for an NGINX ingress and has no effect with the Istio gateway")
	}
	if in.Timeouts != nil && in.Timeouts.Proxy != nil && in.Timeouts.Proxy.Send != nil && *in.Timeouts.Proxy.Send != 120 {
		out = append(out, "spec.ingress.timeouts.proxy.send has no effect with the Istio gateway "+
			"(the VirtualService has one request timeout: timeouts.proxy.read)")
	}
	return out
}

// userSecretNameProblem is why name cannot be a user-chosen Secret name ("" when it can).
func userSecretNameProblem(name string) string {
	if name == "" || isAutoProvision(name) {
		return ""
	}
	if strings.Contains(name, "/") {
		return rustDebug(name) + " names another namespace; only a Secret name is accepted " +
			"(the Secret lives in the CR's namespace, the TLS secret in the Istio namespace)"
	}
	alnum := func(b byte) bool { return 'a' <= b && b <= 'z' || '0' <= b && b <= '9' }
	valid := len(name) <= 253 && alnum(name[0]) && alnum(name[len(name)-1])
	for i := 0; valid && i < len(name); i++ {
		valid = alnum(name[i]) || name[i] == '-' || name[i] == '.'
	}
	if !valid {
		return rustDebug(name) + " is not a valid Secret name (lowercase letters, digits, '-' and '.', " +
			"starting and ending with a letter or digit, at most 253 characters)"
	}
	if slices.Contains(operatorSecrets[:], name) {
		return rustDebug(name) + " is one of the operator's own Secrets; choose another name or auto-provision"
	}
	return ""
}

// rustDebug quotes s like Rust's `{:?}` of a str: \0 \t \r \n \\ \" escaped, combining marks and
// unprintable characters as \u{hex}, everything else (' included) as is.
func rustDebug(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case 0:
			b.WriteString(`\0`)
		case '\t':
			b.WriteString(`\t`)
		case '\r':
			b.WriteString(`\r`)
		case '\n':
			b.WriteString(`\n`)
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		default:
			if unicode.In(r, unicode.Mn, unicode.Me, unicode.Other_Grapheme_Extend) ||
				!unicode.IsPrint(r) {
				b.WriteString(`\u{` + strconv.FormatInt(int64(r), 16) + `}`)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
