# Connectivity Proxy module operator. `make run` and `make test` are all a new machine needs.
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/cp-operator/target
export CARGO_TERM_COLOR ?= never
BIN := $(CARGO_TARGET_DIR)/debug

.PHONY: all run test lint fmt k8s-bins build manifests check-manifests check-leaks clean-local soak fuzz bench go-peer

all: build

## Kubernetes binaries (kube-apiserver, kube-controller-manager, etcd, kubectl), built once into a
## version-keyed cache under ~/.cache/cp-operator.
k8s-bins:
	@bash hack/k8s-bins.sh >/dev/null

build:
	cargo build --workspace --bins

## Regenerate the CRDs from the Rust types.
manifests:
	cargo run -q -p cp-api --bin crdgen -- manifests

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

## fmt + clippy + unit tests + integration tests on a real local control plane.
test: k8s-bins lint build
	cargo test --workspace --no-fail-fast
	@$(MAKE) --no-print-directory check-leaks

## Fails if a control-plane process outlived the tests (the watchdog stops them within seconds).
check-leaks:
	@for i in $$(seq 1 50); do \
	  left=$$(ps -eo pid=,args= | grep -E 'cp-operator/k8s-[^ ]*/bin/(kube-apiserver|kube-controller-manager|etcd) ' | grep -v grep || true); \
	  [ -z "$$left" ] && exit 0; sleep 0.2; \
	done; echo "control-plane processes left running:"; echo "$$left"; exit 1

## The controller SIGKILLed at random points of 20 legacy takeovers, each on a fresh control plane
## (about 5 minutes). CP_SOAK_RUNS and CP_SOAK_SEED change or replay it.
soak: k8s-bins build
	cargo test -p cp-tests --test soak -- --ignored --nocapture
	@$(MAKE) --no-print-directory check-leaks

## Coverage-guided fuzzing (cargo-fuzz, nightly) of AdmissionReview decode + mutate + validate and of
## the legacy configuration import; FUZZ_SECONDS per target (default 120).
fuzz:
	bash hack/fuzz.sh

## The controller-runtime webhook peer the benchmarks compare against (Go, cached by source time).
go-peer:
	@bash hack/build-go-peer.sh

## Benchmarks on a local control plane, release builds, loopback only: writes BENCHMARKS.md.
## BENCH_FLAGS=--quick for a short run.
bench: k8s-bins go-peer
	cargo build --release -p cp-webhook -p cp-controller -p cp-bench --bins
	cargo bench -q -p cp-bench --bench admission -- --warm-up-time 1 --measurement-time 3
	CP_WEBHOOK_LOG=warn CP_CONTROLLER_LOG=warn $(CARGO_TARGET_DIR)/release/cp-bench $(BENCH_FLAGS)
	@$(MAKE) --no-print-directory check-leaks

## A local control plane with the module installed and the default CR; Ctrl-C stops everything.
run: k8s-bins build
	$(BIN)/cp-local
