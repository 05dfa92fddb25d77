// Command gowebhook is the benchmark peer of the Rust cp-webhook's ConnectivityProxy endpoints:
// the same spec.deployment defaulting (/mutate) and the same validation (/validate: protected
// fields, typed spec without unknown fields, cross-field rules, warnings), written the way a
// controller-runtime user would, on the webhook server alone (no manager, no kubeconfig, no API
// server).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

type config struct {
	addr, certFile, keyFile, defaultsFile string
	users, groups                         string
	disableHTTP2                          bool
	pprofAddr                             string
	logAdmittedAtInfo                     bool
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", "127.0.0.1:9443", "host:port of the TLS admission server")
	flag.StringVar(&c.certFile, "tls-cert-file", "", "PEM serving certificate (watched and reloaded)")
	flag.StringVar(&c.keyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	flag.StringVar(&c.defaultsFile, "defaults-file", "", "JSON object: the default spec.deployment")
	flag.StringVar(&c.users, "privileged-users", "", "comma-separated usernames that may change spec.deployment")
	flag.StringVar(&c.groups, "privileged-groups", "", "comma-separated groups that may change spec.deployment")
	flag.BoolVar(&c.disableHTTP2, "disable-http2", false, "offer only http/1.1 over ALPN (kubebuilder's scaffold default); "+
		"by default h2 is offered like the Rust webhook does")
	flag.StringVar(&c.pprofAddr, "pprof-addr", "", "loopback host:port serving net/http/pprof (/debug/pprof/) over plain HTTP; "+
		"empty (default): off")
	flag.BoolVar(&c.logAdmittedAtInfo, "log-admitted-at-info", false, "log allowed and patched requests at info too "+
		"(one line per request); by default they are logged at debug and only denials at info, as the Rust webhook does")
	sampling := flag.Bool("log-sampling", false, "keep controller-runtime's production log sampling (the first 100 lines "+
		"per message and second, then every 100th); by default every decision is logged, like the Rust webhook")
	zapOpts := crzap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	root := newLogger(zapOpts, *sampling)
	logf.SetLogger(root)

	if err := run(c, root); err != nil {
		root.WithName("gowebhook").Error(err, "webhook server failed")
		os.Exit(1)
	}
}

// newLogger is controller-runtime's zap.New(zap.UseFlagOptions(&o)) without the sampler that its
// production mode wraps around the core (which would drop most "admission decision" lines
// under load), unless sampling is asked for. Encoder, level, stack-trace level and time encoding
// come from the --zap-* flags with controller-runtime's defaults (production: JSON, info).
func newLogger(o crzap.Options, sampling bool) logr.Logger {
	if sampling {
		return crzap.New(crzap.UseFlagOptions(&o))
	}
	dest := o.DestWriter
	if dest == nil {
		dest = os.Stderr
	}
	level, stack := o.Level, o.StacktraceLevel
	var zapOpts []zap.Option
	newEncoder := o.NewEncoder
	if o.Development {
		if newEncoder == nil {
			newEncoder = func(opts ...crzap.EncoderConfigOption) zapcore.Encoder {
				return zapcore.NewConsoleEncoder(encoderConfig(zap.NewDevelopmentEncoderConfig(), opts))
			}
		}
		if level == nil {
			level = zap.NewAtomicLevelAt(zap.DebugLevel)
		}
		if stack == nil {
			stack = zap.NewAtomicLevelAt(zap.WarnLevel)
		}
		zapOpts = append(zapOpts, zap.Development())
	} else {
		if newEncoder == nil {
			newEncoder = func(opts ...crzap.EncoderConfigOption) zapcore.Encoder {
				return zapcore.NewJSONEncoder(encoderConfig(zap.NewProductionEncoderConfig(), opts))
			}
		}
		if level == nil {
			level = zap.NewAtomicLevelAt(zap.InfoLevel)
		}
		if stack == nil {
			stack = zap.NewAtomicLevelAt(zap.ErrorLevel)
		}
	}
	timeEncoder := o.TimeEncoder
	if timeEncoder == nil {
		timeEncoder = zapcore.RFC3339TimeEncoder
	}
	encOpts := append([]crzap.EncoderConfigOption{func(c *zapcore.EncoderConfig) { c.EncodeTime = timeEncoder }},
		o.EncoderConfigOptions...)
	encoder := o.Encoder
	if encoder == nil {
		encoder = newEncoder(encOpts...)
	}
	sink := zapcore.AddSync(dest)
	zapOpts = append(zapOpts, o.ZapOpts...)
	zapOpts = append(zapOpts, zap.AddStacktrace(stack), zap.ErrorOutput(sink))
	core := zapcore.NewCore(&crzap.KubeAwareEncoder{Encoder: encoder, Verbose: o.Development}, sink, level)
	return zapr.NewLogger(zap.New(core, zapOpts...))
}

func encoderConfig(c zapcore.EncoderConfig, opts []crzap.EncoderConfigOption) zapcore.EncoderConfig {
	for _, o := range opts {
		o(&c)
	}
	return c
}

func run(c config, root logr.Logger) error {
	log := root.WithName("gowebhook")
	if c.certFile == "" || c.keyFile == "" {
		return fmt.Errorf("--tls-cert-file and --tls-key-file are required")
	}
	defaults, err := loadDefaults(c.defaultsFile)
	if err != nil {
		return err
	}
	host, portStr, err := net.SplitHostPort(c.addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return fmt.Errorf("--addr: bad port %q", portStr)
	}
	priv := privileged{users: splitList(c.users), groups: splitList(c.groups)}
	log.Info("identities that may change spec.deployment", "who", priv.describe())
	// The Go runtime's defaults are kept: GOGC=100 and GOMAXPROCS from the CPU affinity mask and
	// the cgroup CPU limit, unless the environment sets them.
	log.Info("runtime", "go", runtime.Version(), "GOMAXPROCS", runtime.GOMAXPROCS(0),
		"GOGC", envOr("GOGC", "100"), "GOMEMLIMIT", envOr("GOMEMLIMIT", "off"))

	ctx := signals.SetupSignalHandler()
	if c.pprofAddr != "" {
		addr, err := startPprof(ctx, c.pprofAddr)
		if err != nil {
			return err
		}
		log.Info("serving pprof", "url", "http://"+addr+"/debug/pprof/")
	}

	// Cert and key may live in different directories, so watch them directly (as kubebuilder's
	// scaffold does) instead of through Options.CertDir.
	watcher, err := certwatcher.New(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("loading the serving certificate: %w", err)
	}
	tlsOpts := []func(*tls.Config){func(t *tls.Config) {
		t.MinVersion = tls.VersionTLS12
		t.GetCertificate = watcher.GetCertificate
		if c.disableHTTP2 {
			t.NextProtos = []string{"http/1.1"}
		}
	}}

	srv := webhook.NewServer(webhook.Options{Host: host, Port: port, TLSOpts: tlsOpts})
	// The request logger is the plain "admission" logger: logDecision adds the request's fields
	// itself, once, and only when its line is enabled (controller-runtime's DefaultLogConstructor
	// would build a With() logger of object/resource/user/requestID on every request).
	reqLog := root.WithName("admission")
	logConstructor := func(logr.Logger, *admission.Request) logr.Logger { return reqLog }
	srv.Register("/mutate", &webhook.Admission{
		Handler:        &mutator{defaults: defaults, logAdmittedAtInfo: c.logAdmittedAtInfo},
		LogConstructor: logConstructor,
	})
	srv.Register("/validate", &webhook.Admission{
		Handler:        &validator{defaults: defaults, privileged: priv, logAdmittedAtInfo: c.logAdmittedAtInfo},
		LogConstructor: logConstructor,
	})
	srv.WebhookMux().HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})

	go func() {
		if err := watcher.Start(ctx); err != nil {
			root.WithName("certwatcher").Error(err, "certificate watcher stopped")
		}
	}()
	return srv.Start(ctx)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// startPprof serves net/http/pprof on plain HTTP at addr, which must be a loopback address, until
// ctx ends. Returns the address listened on.
func startPprof(ctx context.Context, addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--pprof-addr: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return "", fmt.Errorf("--pprof-addr %s: not a loopback address (pprof has no authentication)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("--pprof-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// No write timeout: /debug/pprof/profile?seconds=N answers after N seconds.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logf.Log.WithName("pprof").Error(err, "pprof server stopped")
		}
	}()
	return ln.Addr().String(), nil
}
