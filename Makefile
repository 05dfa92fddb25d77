# Connectivity Proxy module operator. `make run` and `make test` are all a new machine needs.
SHELL := /bin/bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/cp-operator/target
export CARGO_TERM_COLOR ?= never
BIN := $(CARGO_TARGET_DIR)/debug

.PHONY: all run test lint fmt k8s-bins build manifests check-manifests check-leaks clean-local soak

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

## A local control plane with the module installed and the default CR; Ctrl-C stops everything.
run: k8s-bins build
	$(BIN)/cp-local
