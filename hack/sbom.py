#!/usr/bin/env python3
"""CycloneDX 1.5 SBOM per operator image, from `cargo metadata` (standard library only).

    python3 hack/sbom.py [--out-dir DIR] [webhook|controller|cp-webhook|cp-controller ...]
    python3 hack/sbom.py [--out-dir DIR] --from-binary BIN [--suffix -fips] webhook|controller

Writes DIR/<image>-<version>.cdx.json (default DIR: dist/sbom; default images: both). The components are
the normal dependency closure (no dev- or build-dependencies) of the image's binary crate for the Linux
target the images are built for, as `Cargo.lock` pins it; each has a purl (pkg:cargo/name@version), the
license expression of its manifest and, for registry crates, the SHA-256 `Cargo.lock` records.
metadata.component is the image: its registry name (shared/src/bundle.rs IMAGE_REGISTRY) and version.
Builds nothing; SOURCE_DATE_EPOCH, when set, fixes the timestamp.

--from-binary: the components are the dependency list `cargo auditable` embedded in that binary (read
with rust-audit-info, hack/auditable-tools.sh), i.e. the features of that build (the FIPS build's
aws-lc-fips-sys, not ring's default), named DIR/<image>-<version><suffix>.cdx.json; hack/images.sh writes
one beside every image it builds.
"""

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = "x86_64-unknown-linux-gnu"  # hack/images.sh builds for this target
IMAGES = {"webhook": "cp-webhook", "controller": "cp-controller"}


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def image_registry():
    text = (ROOT / "shared/src/bundle.rs").read_text()
    m = re.search(r'pub const IMAGE_REGISTRY: &str =\s*"([^"]+)"', text)
    if not m:
        fail("cannot read IMAGE_REGISTRY from shared/src/bundle.rs")
    return m.group(1)


def cargo_metadata(all_features=False):
    base = [os.environ.get("CARGO", "cargo"), "metadata", "--format-version", "1", "--locked", "--filter-platform", TARGET]
    if all_features:  # the package facts of every optional crate a binary's own list may name
        base.append("--all-features")
    # Offline first (everything a build needs is cached); the registry only when something is missing.
    for extra in (["--offline"], []):
        run = subprocess.run(base + extra, cwd=ROOT, capture_output=True, text=True)
        if run.returncode == 0:
            return json.loads(run.stdout)
    last = run.stderr.strip().splitlines()
    fail(f"cargo metadata failed: {last[-1] if last else run.returncode}")


def lock_checksums():
    lock = tomllib.loads((ROOT / "Cargo.lock").read_text())
    return {
        (p["name"], p["version"]): p["checksum"]
        for p in lock.get("package", [])
        if "checksum" in p
    }


def license_expression(pkg):
    """The manifest's license as an SPDX expression (old crates write `MIT/Apache-2.0`)."""
    lic = pkg.get("license")
    if lic:
        return " OR ".join(part.strip() for part in lic.split("/"))
    return None


def reachable(root, edges):
    """The package ids reachable from `root` along `edges` (root included)."""
    seen, todo = set(), [root]
    while todo:
        pkg_id = todo.pop()
        if pkg_id in seen:
            continue
        seen.add(pkg_id)
        todo.extend(edges[pkg_id])
    return seen


def closure(meta, crate):
    """Package ids of `crate` and its normal (non-dev, non-build) dependencies, transitively."""
    roots = [
        p["id"]
        for p in meta["packages"]
        if p["name"] == crate and p["id"] in meta["workspace_members"]
    ]
    if len(roots) != 1:
        fail(f"{crate} is not a workspace member")
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    edges = {}
    for node_id, node in nodes.items():
        edges[node_id] = sorted(
            d["pkg"]
            for d in node["deps"]
            if any(k["kind"] is None for k in d["dep_kinds"])
        )
    return roots[0], reachable(roots[0], edges), edges


def closure_from_binary(meta, crate, binary):
    """Like closure(), from the dependency list embedded in `binary` (the crates of that very build)."""
    tools = subprocess.run(["bash", str(ROOT / "hack/auditable-tools.sh")], capture_output=True, text=True)
    if tools.returncode != 0:
        fail(f"hack/auditable-tools.sh: {tools.stderr.strip()}")
    run = subprocess.run([str(Path(tools.stdout.strip()) / "rust-audit-info"), binary], capture_output=True, text=True)
    if run.returncode != 0:
        fail(f"rust-audit-info {binary}: {run.stderr.strip()} (built with `cargo auditable`?)")
    embedded = json.loads(run.stdout)["packages"]
    by_name_version = {}
    for p in meta["packages"]:
        by_name_version.setdefault((p["name"], p["version"]), p["id"])
    ids = []
    for p in embedded:
        pkg_id = by_name_version.get((p["name"], p["version"]))
        if pkg_id is None:
            fail(f"{binary}: {p['name']} {p['version']} is not in this checkout's Cargo.lock")
        ids.append(pkg_id)
    roots = [ids[i] for i, p in enumerate(embedded) if p.get("root")]
    root_names = [p["name"] for p in embedded if p.get("root")]
    if root_names != [crate]:
        fail(f"{binary} is the binary of {root_names}, not of {crate}")
    edges = {
        ids[i]: sorted({ids[d] for d in p.get("dependencies", []) if embedded[d].get("kind", "runtime") == "runtime"})
        for i, p in enumerate(embedded)
    }
    return roots[0], reachable(roots[0], edges), edges


def purl(pkg):
    return f"pkg:cargo/{pkg['name']}@{pkg['version']}"


def sbom(meta, checksums, registry, image, binary=None, suffix=""):
    crate = IMAGES[image]
    root_id, ids, edges = closure_from_binary(meta, crate, binary) if binary else closure(meta, crate)
    packages = {p["id"]: p for p in meta["packages"]}
    version = packages[root_id]["version"] + suffix
    image_ref = f"{registry}/{image}"
    components, refs = [], {}
    for pkg_id in sorted(ids, key=lambda i: (packages[i]["name"], packages[i]["version"], i)):
        pkg = packages[pkg_id]
        ref = purl(pkg)
        if ref in refs.values():
            continue  # the same name@version from two sources: listed once
        refs[pkg_id] = ref
        component = {
            "type": "application" if pkg_id == root_id else "library",
            "bom-ref": ref,
            "name": pkg["name"],
            "version": pkg["version"],
            "purl": ref,
        }
        if pkg.get("description"):
            component["description"] = " ".join(pkg["description"].split())
        expression = license_expression(pkg)
        if expression:
            component["licenses"] = [{"expression": expression}]
        elif pkg.get("license_file"):
            component["licenses"] = [{"license": {"name": f"see {pkg['license_file']}"}}]
        checksum = checksums.get((pkg["name"], pkg["version"]))
        if checksum:
            component["hashes"] = [{"alg": "SHA-256", "content": checksum}]
        if pkg.get("repository"):
            component["externalReferences"] = [{"type": "vcs", "url": pkg["repository"]}]
        components.append(component)
    dependencies = [{"ref": image_ref, "dependsOn": [refs[root_id]]}]
    for pkg_id, ref in refs.items():
        depends = sorted({refs[d] for d in edges[pkg_id] if d in refs})
        dependencies.append({"ref": ref, "dependsOn": depends})
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    now = (
        datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
        if epoch
        else datetime.datetime.now(datetime.timezone.utc)
    )
    return version, {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.uuid4()}",
        "version": 1,
        "metadata": {
            "timestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tools": {"components": [{"type": "application", "name": "hack/sbom.py"}]},
            "component": {
                "type": "container",
                "bom-ref": image_ref,
                "name": image_ref,
                "version": version,
                "description": f"{crate} image ({image_ref}:{version}), built by hack/images.sh",
            },
            "properties": [{"name": "cargo:target", "value": TARGET}],
        },
        "components": components,
        "dependencies": dependencies,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=str(ROOT / "dist/sbom"))
    parser.add_argument("--from-binary", help="the image's binary, built with cargo auditable")
    parser.add_argument("--suffix", default="", help="appended to the version (e.g. -fips)")
    parser.add_argument("images", nargs="*", default=list(IMAGES))
    args = parser.parse_args()
    if args.from_binary and len(args.images) != 1:
        fail("--from-binary takes exactly one image")
    images = [i.removeprefix("cp-") for i in args.images]
    for image in images:
        if image not in IMAGES:
            fail(f"unknown image {image!r}: one of {', '.join(IMAGES)}")
    meta = cargo_metadata(all_features=bool(args.from_binary))
    checksums = lock_checksums()
    registry = image_registry()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for image in images:
        version, bom = sbom(meta, checksums, registry, image, args.from_binary, args.suffix)
        path = out / f"{image}-{version}.cdx.json"
        path.write_text(json.dumps(bom, indent=2) + "\n")
        print(f">> {path}: {len(bom['components'])} components", file=sys.stderr)


if __name__ == "__main__":
    main()
