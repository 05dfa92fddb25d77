package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// The bench's requests (bench/src/reviews.rs, byte for byte): testdata/bench-mutate-create.json is
// the CREATE of the module's default CR without spec.deployment sent to /mutate (1270 bytes);
// testdata/bench-validate-update.json the UPDATE of the defaulted CR adding a label, by alice, sent
// to /validate (2784 bytes).

// BenchmarkMutateDecide is the /mutate handler's decision on the bench's request.
func BenchmarkMutateDecide(b *testing.B) {
	m := &mutator{defaults: testDefaults(b)}
	req := request(b, "testdata/bench-mutate-create.json")
	b.ReportAllocs()
	for b.Loop() {
		if resp := m.decide(req); len(resp.Patch) == 0 {
			b.Fatal("no patch")
		}
	}
}

// BenchmarkValidateDecide is the /validate handler's decision on the bench's request (a
// metadata-only update: protected-field check only, as in Rust).
func BenchmarkValidateDecide(b *testing.B) {
	v := testValidator(b)
	req := request(b, "testdata/bench-validate-update.json")
	b.ReportAllocs()
	for b.Loop() {
		if resp := v.decide(req); !resp.Allowed {
			b.Fatal(resp.Result)
		}
	}
}

// BenchmarkValidateDecideCreate is /validate on a CREATE of the defaulted CR: the full path
// (typed strict decode, protected fields against the defaults, every cross-field rule). Not in
// the bench's load; for comparison.
func BenchmarkValidateDecideCreate(b *testing.B) {
	v := testValidator(b)
	req := review(b, admissionv1.Create, "alice", defaultedCR(b), nil)
	b.ReportAllocs()
	for b.Loop() {
		if resp := v.decide(req); !resp.Allowed {
			b.Fatal(resp.Result)
		}
	}
}

// serveBench runs controller-runtime's webhook HTTP handler (AdmissionReview decode, Handle,
// response encode) on body, without TLS or a socket. log is the request logger.
func serveBench(b *testing.B, h admission.Handler, file string, log logr.Logger) {
	body, err := os.ReadFile(file)
	if err != nil {
		b.Fatal(err)
	}
	wh := &admission.Webhook{Handler: h, LogConstructor: func(logr.Logger, *admission.Request) logr.Logger { return log }}
	rd := bytes.NewReader(body)
	w := &discardWriter{header: http.Header{}}
	r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/", rd)
	r.Header.Set("Content-Type", "application/json")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		r.Body = io.NopCloser(rd)
		w.n = 0
		wh.ServeHTTP(w, r)
		if w.n == 0 {
			b.Fatal("no answer")
		}
	}
}

type discardWriter struct {
	header http.Header
	n      int
}

func (w *discardWriter) Header() http.Header { return w.header }
func (w *discardWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	return len(p), nil
}
func (w *discardWriter) WriteHeader(int) {}

func infoLogger(b *testing.B) logr.Logger {
	opts := crzap.Options{DestWriter: io.Discard}
	fs := newFlagSet()
	opts.BindFlags(fs)
	if err := fs.Parse([]string{"--zap-log-level=info", "--zap-encoder=json"}); err != nil {
		b.Fatal(err)
	}
	return newLogger(opts, false).WithName("admission")
}

// BenchmarkMutateServeHTTP and BenchmarkValidateServeHTTP are the whole controller-runtime
// request path minus TLS/HTTP, logging off (the bench runs --zap-log-level=error).
func BenchmarkMutateServeHTTP(b *testing.B) {
	serveBench(b, &mutator{defaults: testDefaults(b)}, "testdata/bench-mutate-create.json", logr.Discard())
}

func BenchmarkValidateServeHTTP(b *testing.B) {
	serveBench(b, testValidator(b), "testdata/bench-validate-update.json", logr.Discard())
}

// The same with one JSON info line per request (--log-admitted-at-info, to io.Discard). By
// default these admitted requests are logged at debug, as the Rust webhook logs them: nothing at info.
func BenchmarkMutateServeHTTPLogInfo(b *testing.B) {
	m := &mutator{defaults: testDefaults(b), logAdmittedAtInfo: true}
	serveBench(b, m, "testdata/bench-mutate-create.json", infoLogger(b))
}

func BenchmarkValidateServeHTTPLogInfo(b *testing.B) {
	v := testValidator(b)
	v.logAdmittedAtInfo = true
	serveBench(b, v, "testdata/bench-validate-update.json", infoLogger(b))
}
