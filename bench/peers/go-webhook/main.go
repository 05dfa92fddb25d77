// Command gowebhook is the benchmark peer of the Rust cp-webhook: the same spec.deployment
// defaulting (/mutate) and protected-field check (/validate) for ConnectivityProxy, written
// the way a controller-runtime user would, on the webhook server alone (no manager, no
// kubeconfig, no API server).
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"

	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9443", "host:port of the TLS admission server")
	certFile := flag.String("tls-cert-file", "", "PEM serving certificate (watched and reloaded)")
	keyFile := flag.String("tls-key-file", "", "PEM private key of --tls-cert-file")
	defaultsFile := flag.String("defaults-file", "", "JSON object: the default spec.deployment")
	users := flag.String("privileged-users", "", "comma-separated usernames that may change spec.deployment")
	groups := flag.String("privileged-groups", "", "comma-separated groups that may change spec.deployment")
	disableHTTP2 := flag.Bool("disable-http2", false, "offer only http/1.1 over ALPN (kubebuilder's scaffold default); "+
		"by default h2 is offered like the Rust webhook does")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	logf.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := logf.Log.WithName("gowebhook")

	if err := run(*addr, *certFile, *keyFile, *defaultsFile, *users, *groups, *disableHTTP2); err != nil {
		log.Error(err, "webhook server failed")
		os.Exit(1)
	}
}

func run(addr, certFile, keyFile, defaultsFile, users, groups string, disableHTTP2 bool) error {
	if certFile == "" || keyFile == "" {
		return fmt.Errorf("--tls-cert-file and --tls-key-file are required")
	}
	defaults, err := loadDefaults(defaultsFile)
	if err != nil {
		return err
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return fmt.Errorf("--addr: bad port %q", portStr)
	}
	priv := privileged{users: splitList(users), groups: splitList(groups)}
	logf.Log.WithName("gowebhook").Info("identities that may change spec.deployment", "who", priv.describe())

	// Cert and key may live in different directories, so watch them directly (as kubebuilder's
	// scaffold does) instead of through Options.CertDir.
	watcher, err := certwatcher.New(certFile, keyFile)
	if err != nil {
		return fmt.Errorf("loading the serving certificate: %w", err)
	}
	tlsOpts := []func(*tls.Config){func(c *tls.Config) {
		c.MinVersion = tls.VersionTLS12
		c.GetCertificate = watcher.GetCertificate
		if disableHTTP2 {
			c.NextProtos = []string{"http/1.1"}
		}
	}}

	srv := webhook.NewServer(webhook.Options{Host: host, Port: port, TLSOpts: tlsOpts})
	srv.Register("/mutate", &webhook.Admission{Handler: &mutator{defaults: defaults}})
	srv.Register("/validate", &webhook.Admission{Handler: &validator{defaults: defaults, privileged: priv}})
	srv.WebhookMux().HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})

	ctx := signals.SetupSignalHandler()
	go func() {
		if err := watcher.Start(ctx); err != nil {
			logf.Log.WithName("certwatcher").Error(err, "certificate watcher stopped")
		}
	}()
	return srv.Start(ctx)
}

// loadDefaults reads the default spec.deployment once.
func loadDefaults(path string) (map[string]any, error) {
	if path == "" {
		return nil, fmt.Errorf("--defaults-file is required")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--defaults-file: %w", err)
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("--defaults-file %s: %w", path, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("--defaults-file %s: not a JSON object", path)
	}
	return m, nil
}
