//! Image references the module runs, in the form lifecycle-manager can localize.
//!
//! lifecycle-manager rewrites images for restricted markets only where it sees them: the `image` and
//! the `env[].value` of every container of the bundle's Deployments and StatefulSets
//! (`internal/imagerewrite` in kyma-project/lifecycle-manager). The proxy and utility images are not in
//! the bundle's workloads (the controller renders the proxy's StatefulSet later), so both operator
//! Deployments carry them as env values ([`PROXY_IMAGE_ENV`], [`UTILITY_IMAGE_ENV`]); the webhook and the
//! controller read them at start and use them as this release's `spec.deployment.image` and
//! `utilityImage` defaults. A rewritten env value thus reaches the CR and the proxy's pods.

use crate::cp::Image;

/// The env var (on both operator Deployments) naming the Connectivity Proxy image.
pub const PROXY_IMAGE_ENV: &str = "CP_PROXY_IMAGE";
/// The env var (on both operator Deployments) naming the utility image (the proxy's init container).
pub const UTILITY_IMAGE_ENV: &str = "CP_UTILITY_IMAGE";

/// An image reference split as the CR's `spec.deployment.image` holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef {
    /// Registry host (and port), `docker.io` when the reference names none.
    pub registry: String,
    /// Path below the registry (`library/` prefixed for a one-segment Docker Hub name).
    pub repository: String,
    /// Tag; empty when only a digest is given.
    pub tag: String,
    /// `sha256:...`, if the reference pins one.
    pub digest: Option<String>,
}

/// Why a reference is not an image reference the module can run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageRefError {
    /// Empty or blank.
    #[error("the image reference is empty")]
    Empty,
    /// Neither a tag nor a digest: the module never runs a floating `latest`.
    #[error("image {0:?} names neither a tag nor a digest (write registry/repository:tag)")]
    NoTagOrDigest(String),
    /// Characters or a shape no registry accepts.
    #[error("image {0:?} is not a valid reference: {1}")]
    Invalid(String, &'static str),
}

impl ImageRef {
    /// Parses `registry/path/name:tag` or `...@sha256:...`, normalised as Docker does (a first
    /// segment without `.` or `:` and other than `localhost` is a Docker Hub path).
    pub fn parse(s: &str) -> Result<ImageRef, ImageRefError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(ImageRefError::Empty);
        }
        if s.chars().any(char::is_whitespace) {
            return Err(ImageRefError::Invalid(
                s.into(),
                "white space in the reference",
            ));
        }
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => (n, Some(d.to_string())),
            None => (s, None),
        };
        if let Some(d) = &digest
            && !(d.starts_with("sha256:") && d.len() == 71)
        {
            return Err(ImageRefError::Invalid(
                s.into(),
                "a digest is sha256: and 64 hex digits",
            ));
        }
        // The tag follows the last ':' after the last '/' (a registry port has a ':' before a '/').
        let last_slash = name.rfind('/').map_or(0, |i| i + 1);
        let (path, tag) = match name[last_slash..].rfind(':') {
            Some(i) => (
                &name[..last_slash + i],
                name[last_slash + i + 1..].to_string(),
            ),
            None => (name, String::new()),
        };
        if tag.is_empty() && digest.is_none() {
            return Err(ImageRefError::NoTagOrDigest(s.into()));
        }
        let (registry, repository) = match path.split_once('/') {
            Some((first, rest))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), rest.to_string())
            }
            _ if !path.contains('/') => ("docker.io".to_string(), format!("library/{path}")),
            _ => ("docker.io".to_string(), path.to_string()),
        };
        if repository.is_empty()
            || repository.split('/').any(|seg| {
                seg.is_empty()
                    || !seg
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
            })
        {
            return Err(ImageRefError::Invalid(
                s.into(),
                "the path takes lower-case letters, digits, '.', '_' and '-' between '/'",
            ));
        }
        Ok(ImageRef {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The reference as the proxy's pods run it (`registry/repository:tag` or `...@digest`), the same
    /// rendering as the controller's for `spec.deployment.image` ([`Image::reference`]).
    pub fn reference(&self) -> String {
        self.to_image("IfNotPresent").reference()
    }

    /// The CR's form of this image with `pull_policy` (no pull Secret).
    pub fn to_image(&self, pull_policy: &str) -> Image {
        Image {
            digest: self.digest.clone(),
            pull_policy: Some(pull_policy.into()),
            pull_secret: None,
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            tag: self.tag.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_as_docker_normalises_them() {
        let cases = [
            (
                "docker.io/sapse/connectivity-proxy:2.11.0",
                ("docker.io", "sapse/connectivity-proxy", "2.11.0", None),
            ),
            (
                "sapse/connectivity-proxy:2.11.0",
                ("docker.io", "sapse/connectivity-proxy", "2.11.0", None),
            ),
            (
                "busybox:1.37.0",
                ("docker.io", "library/busybox", "1.37.0", None),
            ),
            (
                "private-registry.com/prod/foo-image:1.2.3",
                ("private-registry.com", "prod/foo-image", "1.2.3", None),
            ),
            ("localhost:5000/a/b:7", ("localhost:5000", "a/b", "7", None)),
            (
                "localhost/cp-node-busybox:0.1.0",
                ("localhost", "cp-node-busybox", "0.1.0", None),
            ),
        ];
        for (s, (registry, repository, tag, digest)) in cases {
            let r = ImageRef::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(
                (
                    r.registry.as_str(),
                    r.repository.as_str(),
                    r.tag.as_str(),
                    r.digest.as_deref()
                ),
                (registry, repository, tag, digest),
                "{s}"
            );
        }
        let d = format!("r.io/p/x@sha256:{}", "a".repeat(64));
        let r = ImageRef::parse(&d).expect("digest");
        assert_eq!(r.reference(), d);
        assert_eq!(
            ImageRef::parse("r.io/p/x:1").map(|r| r.reference()),
            Ok("r.io/p/x:1".to_string())
        );
    }

    #[test]
    fn bad_references_name_the_problem() {
        assert_eq!(ImageRef::parse(" "), Err(ImageRefError::Empty));
        assert!(matches!(
            ImageRef::parse("r.io/p/x"),
            Err(ImageRefError::NoTagOrDigest(_))
        ));
        assert!(matches!(
            ImageRef::parse("r.io/P/x:1"),
            Err(ImageRefError::Invalid(..))
        ));
        assert!(matches!(
            ImageRef::parse("r.io/p/x@sha256:12"),
            Err(ImageRefError::Invalid(..))
        ));
        assert!(matches!(
            ImageRef::parse("r.io//x:1"),
            Err(ImageRefError::Invalid(..))
        ));
        let msg = ImageRef::parse("r.io/p/x").unwrap_err().to_string();
        assert!(msg.contains("tag") && msg.contains("r.io/p/x"), "{msg}");
    }
}
