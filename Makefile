# Connectivity Proxy module operator. `make run` and `make test` are all a new machine needs.
SHELL := /bin/bash
# Rust build output outside the checkout but keyed by it: two clones or worktrees never share binaries
# (a binary compiles in its workspace's path). CARGO_TARGET_DIR in the environment wins.
CHECKOUT_KEY := $(shell printf '%s' "$(CURDIR)" | sha256sum | cut -c1-16)
export CARGO_TARGET_DIR ?= $(HOME)/.cache/cp-operator/target-$(CHECKOUT_KEY)
export CARGO_TERM_COLOR ?= never
BIN := $(CARGO_TARGET_DIR)/debug

.PHONY: all run run-cluster test lint fmt k8s-bins node-bins build manifests check-leaks soak fuzz bench go-peer \
	preflight images images-fips test-images test-fips prom-bins check check-reference print-target-dir deny audit release sbom test-skew

all: build

## Kubernetes binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet,
## kube-proxy), built once into a version-keyed cache under ~/.cache/cp-operator.
k8s-bins: preflight
	@bash hack/k8s-bins.sh >/dev/null

## The node's container runtime: containerd 2 + shim + ctr from the Go module (version-keyed cache); runc,
## CNI plugins, iptables, busybox-static from Debian when missing (root); kube-router (the node's
## NetworkPolicy engine) from its Go module and ipset from Debian (hack/npc-bins.sh).
node-bins: preflight
	@bash hack/node-bins.sh >/dev/null
	@bash hack/npc-bins.sh >/dev/null

## Prometheus and promtool from their Go module (tests/k8s-bins/prometheus, version-keyed cache): the
## programs that judge the alert rules and dashboards in the tests.
prom-bins: preflight
	@bash hack/prom-bins.sh >/dev/null

## Go, Rust and make present and recent enough; says how long a first build takes.
preflight:
	@bash hack/preflight.sh

print-target-dir:
	@echo $(CARGO_TARGET_DIR)

build: preflight
	cargo build --workspace --bins

## Regenerate the CRDs from the Rust types.
manifests:
	cargo run -q -p cp-api --bin crdgen -- manifests

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

## Dependency licenses, bans and sources (cargo-deny, deny.toml); reaches only crates.io.
deny:
	@bash hack/cargo-deny.sh

## RustSec advisories (cargo-deny); needs github.com for the advisory database, so not in `make test`.
audit:
	@bash hack/cargo-deny.sh advisories

## The quick checks: fmt, clippy -D warnings, every unit test and every test that needs no API server,
## no root and no release build (the offline packaging/release/standalone tests, the controller
## library's tests, the YAML 1.1 writer against PyYAML).
check: preflight
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo test --workspace --no-fail-fast --lib --bins --test offline --test library --test yaml11_pyyaml

## fmt + clippy + cargo-deny + unit tests + integration tests on a real local control plane and a real
## node (root), the node running images built with the test-image profile.
test: k8s-bins node-bins prom-bins lint deny build test-images
	@bash hack/preflight.sh test >/dev/null
	@bash hack/test.sh
	@$(MAKE) --no-print-directory check-leaks

## The FIPS build's tests (docs/fips.md): the webhook and controller built on aws-lc-rs in FIPS mode, the
## cp-certs and cp-webhook unit tests in that build, then the webhook's, the certificate and the FIPS
## tests on a local control plane with the FIPS binaries (hack/test-fips.sh). CI runs it after `make test`.
test-fips: k8s-bins build
	@bash hack/test-fips.sh
	@$(MAKE) --no-print-directory check-leaks

## The control-plane and node tests on three Kubernetes minors (the newest, as `make test`, and the older
## ones pinned in tests/k8s-bins/skew/); SKEW_VERSIONS picks some. Not part of `make test` (README).
test-skew: k8s-bins node-bins test-images
	@bash hack/test-skew.sh
	@$(MAKE) --no-print-directory check-leaks

## Fails if a control-plane process outlived the tests (the watchdog stops them within seconds).
check-leaks:
	@for i in $$(seq 1 50); do \
	  left=$$(ps -eo pid=,args= | grep -E 'cp-operator/(k8s|containerd|prometheus|kube-router)-[^ ]*/bin/(kube-apiserver|kube-controller-manager|kube-scheduler|etcd|kubelet|kube-proxy|containerd|containerd-shim-runc-v2|prometheus|kube-router) ' | grep -v grep || true); \
	  netns=$$(ip netns list 2>/dev/null | grep -o '^cp-node-[0-9]*' || true); \
	  [ -z "$$left$$netns" ] && exit 0; sleep 0.2; \
	done; echo "control-plane or node processes (or network namespaces) left:"; echo "$$left"; echo "$$netns"; exit 1
	@if command -v podman >/dev/null; then \
	  left=$$(podman --runtime=runc ps -q --filter label=cp-operator.test=1); \
	  if [ -n "$$left" ]; then echo "test containers left running: $$left"; exit 1; fi; \
	fi

## The controller SIGKILLed at random points of 20 legacy takeovers, each on a fresh control plane
## (about 5 minutes). CP_SOAK_RUNS and CP_SOAK_SEED change or replay it.
soak: k8s-bins build
	cargo test --workspace --test soak -- --ignored --nocapture
	@$(MAKE) --no-print-directory check-leaks

## Coverage-guided fuzzing (cargo-fuzz, nightly) of AdmissionReview decode + mutate + validate and of
## the legacy configuration import; FUZZ_SECONDS per target (default 120).
fuzz:
	bash hack/fuzz.sh

## The controller-runtime webhook peer the benchmarks compare against (Go, cached by source time).
go-peer:
	@bash hack/build-go-peer.sh

## Benchmarks on a local control plane, loopback only: writes BENCHMARKS.md. The webhook and controller
## measured are the static release binaries `make images` builds into the images (CP_BIN_DIR).
## BENCH_FLAGS=--quick for a short run.
bench: k8s-bins node-bins go-peer images
	cargo build --release -p cp-bench --bins
	cargo bench -q -p cp-bench --bench admission -- --warm-up-time 1 --measurement-time 3
	CP_BIN_DIR=$(CARGO_TARGET_DIR)/x86_64-unknown-linux-gnu/release CP_WEBHOOK_LOG=info CP_CONTROLLER_LOG=info \
	  $(CARGO_TARGET_DIR)/release/cp-bench $(BENCH_FLAGS)
	@$(MAKE) --no-print-directory check-leaks

## A local control plane with the module installed and the default CR; Ctrl-C stops everything.
run: k8s-bins build
	CP_WORKSPACE=$(CURDIR) $(BIN)/cp-local

## OCI images cp-webhook and cp-controller from the repository's Containerfiles, built offline with buildah
## (installed from Debian when missing): static release binaries on an empty base, non-root, no shell.
## Also the test node's images, never shipped: the stand-in proxy, busybox (the utility image), pause.
images:
	@bash hack/images.sh

## The FIPS images cp-webhook:<version>-fips and cp-controller:<version>-fips (docs/fips.md): the same
## Containerfiles, binaries on aws-lc-rs in FIPS mode (release-fips profile; needs cmake, a C compiler, Go).
images-fips:
	@CP_IMAGE_FIPS=1 bash hack/images.sh

## The same images built with the test-image profile (Cargo.toml: no whole-program optimisation, so a
## change relinks in seconds); what `make test` runs on its node. Never shipped.
test-images:
	@CP_IMAGE_PROFILE=test-image bash hack/images.sh

## The control plane plus a real node (containerd, kubelet, kube-proxy in a network namespace of its own;
## needs root), the module installed from the rendered bundle with kubectl as the module manager does, the
## default CR; the pods and the (stand-in) proxy run by the kubelet. Ctrl-C stops everything.
run-cluster: k8s-bins node-bins build images
	CP_WORKSPACE=$(CURDIR) $(BIN)/cp-local --node

## Compares the project with the upstream files in ../shared/reference (CI runs it where they exist):
## CRD compatibility field by field, the stand-in CRDs, Busola schemas, the default CR, legacy fixtures.
check-reference: k8s-bins build
	CP_REFERENCE_DIR=$${CP_REFERENCE_DIR:-$(CURDIR)/../shared/reference} cargo test --workspace --test reference -- --nocapture
	CP_REFERENCE_DIR=$${CP_REFERENCE_DIR:-$(CURDIR)/../shared/reference} cargo test --workspace --test library -- --ignored --nocapture reference::
	@$(MAKE) --no-print-directory check-leaks

## A release: `make release VERSION=x.y.z` sets the workspace version (the one version source), refreshes
## Cargo.lock, re-renders the manifests, prepends a CHANGELOG.md section with the commits since the last tag,
## builds the images with that tag and writes an SBOM per image to dist/sbom/. Commits, tags and pushes
## nothing: it prints those steps. Refuses a non-semver VERSION and a dirty working tree.
release:
	$(if $(VERSION),,$(error usage: make release VERSION=x.y.z))
	@bash hack/release.sh "$(VERSION)"

## CycloneDX SBOMs of the images at the current version (dist/sbom/{webhook,controller}-<version>.cdx.json),
## from cargo metadata; builds nothing.
sbom:
	@python3 hack/sbom.py --out-dir dist/sbom webhook controller
