//! A CA and one leaf, rotated with overlap: when the CA is renewed, clients are given a bundle with
//! the old and the new CA, the leaf is reissued from the new CA only after that bundle had time to
//! propagate, and the old CA leaves the bundle only after the new leaf had time to propagate. So no
//! client ever sees a leaf it cannot verify.

use std::net::IpAddr;

use time::{Duration, OffsetDateTime};

use crate::renewal::{Decision, Policy, decide};
use crate::{Ca, KeyAlgorithm, Leaf, LeafSpec, Result, inspect, verify_chain};

/// The stored state of a CA and its leaf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Current CA.
    pub ca: Option<Ca>,
    /// Previous CA certificate, still trusted during a rotation.
    pub previous_ca_pem: Option<String>,
    /// When the current CA was created.
    pub ca_created_at: Option<OffsetDateTime>,
    /// When the leaf was last reissued during a CA rotation.
    pub leaf_switched_at: Option<OffsetDateTime>,
    /// The leaf.
    pub leaf: Option<Leaf>,
}

/// What to issue.
#[derive(Clone, Debug)]
pub struct Spec {
    /// CA common name.
    pub ca_common_name: String,
    /// Leaf common name.
    pub common_name: String,
    /// Leaf DNS names (the first is checked when verifying).
    pub dns_names: Vec<String>,
    /// Leaf IP addresses.
    pub ips: Vec<IpAddr>,
    /// CA policy.
    pub ca_policy: Policy,
    /// Leaf policy.
    pub leaf_policy: Policy,
    /// How long a new bundle or leaf needs to reach every client and server.
    pub propagation: Duration,
    /// Key algorithm of new certificates.
    pub algorithm: KeyAlgorithm,
}

/// The outcome of one planning step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// The state to store.
    pub state: State,
    /// The CA bundle clients must trust: previous (if any) then current.
    pub bundle: String,
    /// When to plan again.
    pub next: OffsetDateTime,
    /// Whether a new CA was created.
    pub ca_rotated: bool,
    /// Whether a new leaf was issued.
    pub leaf_rotated: bool,
}

fn ca_ok(ca: &Ca, now: OffsetDateTime, policy: &Policy) -> Option<OffsetDateTime> {
    let info = inspect(&ca.cert_pem).ok()?;
    match decide(now, info.not_before, info.not_after, policy) {
        Decision::Keep { renew_at } => Some(renew_at),
        Decision::Renew(_) => None,
    }
}

fn new_ca(spec: &Spec, now: OffsetDateTime) -> Result<Ca> {
    let (nb, na) = spec.ca_policy.validity(now);
    Ca::generate(&spec.ca_common_name, nb, na, spec.algorithm)
}

fn issue_leaf(spec: &Spec, ca: &Ca, now: OffsetDateTime) -> Result<Leaf> {
    let (nb, mut na) = spec.leaf_policy.validity(now);
    // A leaf never outlives its CA.
    if let Ok(info) = inspect(&ca.cert_pem) {
        na = na.min(info.not_after);
    }
    let dns: Vec<&str> = spec.dns_names.iter().map(String::as_str).collect();
    let mut leaf = LeafSpec::server(&spec.common_name, &dns, &spec.ips, nb, na - nb);
    leaf.not_before = nb;
    leaf.not_after = na;
    leaf.algorithm = spec.algorithm;
    ca.issue(&leaf)
}

/// Whether `leaf` is signed by `ca_pem`, valid now, names every DNS name, and not yet due.
fn leaf_state(
    leaf: &Leaf,
    ca_pem: &str,
    spec: &Spec,
    now: OffsetDateTime,
) -> Option<OffsetDateTime> {
    let host = spec.dns_names.first().cloned().unwrap_or_default();
    if !host.is_empty() && verify_chain(&leaf.cert_pem, ca_pem, &host, now).is_err() {
        return None;
    }
    let info = inspect(&leaf.cert_pem).ok()?;
    if !spec.dns_names.iter().all(|d| info.dns_names.contains(d)) {
        return None;
    }
    match decide(now, info.not_before, info.not_after, &spec.leaf_policy) {
        Decision::Keep { renew_at } => Some(renew_at),
        Decision::Renew(_) => None,
    }
}

/// Plans one step at `now`.
pub fn plan(now: OffsetDateTime, current: &State, spec: &Spec) -> Result<Rotation> {
    let mut state = current.clone();
    let mut ca_rotated = false;
    let mut leaf_rotated = false;
    let mut deadlines = Vec::new();

    // The CA: create, keep, or rotate (keeping the old one trusted).
    let ca_renew_at = match state
        .ca
        .as_ref()
        .and_then(|ca| ca_ok(ca, now, &spec.ca_policy))
    {
        Some(at) => at,
        None => {
            let old = state.ca.take();
            let fresh = new_ca(spec, now)?;
            // An old CA that still parses stays trusted until the new leaf has propagated.
            state.previous_ca_pem = old
                .filter(|c| inspect(&c.cert_pem).is_ok_and(|i| i.not_after > now))
                .map(|c| c.cert_pem);
            state.ca_created_at = Some(now);
            state.leaf_switched_at = None;
            ca_rotated = true;
            let at = ca_ok(&fresh, now, &spec.ca_policy).unwrap_or(now + spec.ca_policy.lifetime);
            state.ca = Some(fresh);
            at
        }
    };
    deadlines.push(ca_renew_at);
    let ca = state
        .ca
        .clone()
        .ok_or_else(|| crate::Error::Check("no CA after planning".into()))?;

    // An expired previous CA verifies nothing any more.
    if state
        .previous_ca_pem
        .as_ref()
        .is_some_and(|p| !inspect(p).is_ok_and(|i| i.not_after > now))
    {
        state.previous_ca_pem = None;
        state.leaf_switched_at = None;
    }

    // The leaf.
    let bundle_propagated = state.previous_ca_pem.is_none()
        || state
            .ca_created_at
            .is_some_and(|t| now >= t + spec.propagation);
    let by_current = state
        .leaf
        .as_ref()
        .and_then(|l| leaf_state(l, &ca.cert_pem, spec, now));
    let by_previous = state.previous_ca_pem.as_ref().and_then(|p| {
        state
            .leaf
            .as_ref()
            .and_then(|l| leaf_state(l, p, spec, now))
    });
    let reissue = match (by_current, by_previous) {
        (Some(at), _) => {
            deadlines.push(at);
            false
        }
        // Still signed by the previous CA: move to the new CA once the bundle has propagated.
        (None, Some(at)) => {
            if bundle_propagated {
                true
            } else {
                deadlines.push(at);
                deadlines.push(state.ca_created_at.unwrap_or(now) + spec.propagation);
                false
            }
        }
        (None, None) => true,
    };
    if reissue {
        let leaf = issue_leaf(spec, &ca, now)?;
        if let Some(at) = leaf_state(&leaf, &ca.cert_pem, spec, now) {
            deadlines.push(at);
        }
        state.leaf = Some(leaf);
        if state.previous_ca_pem.is_some() {
            state.leaf_switched_at = Some(now);
        }
        leaf_rotated = true;
    }

    // Drop the previous CA once the new leaf has propagated.
    if state.previous_ca_pem.is_some() && !leaf_rotated {
        match state.leaf_switched_at {
            Some(t) if now >= t + spec.propagation => {
                state.previous_ca_pem = None;
                state.leaf_switched_at = None;
            }
            Some(t) => deadlines.push(t + spec.propagation),
            // The leaf is the current CA's but no switch was recorded: nothing needs the previous CA
            // beyond the rotation's window (two propagation times from the new CA), which ends now.
            None if by_current.is_some() => match state.ca_created_at {
                Some(t) if now < t + spec.propagation * 2 => {
                    deadlines.push(t + spec.propagation * 2)
                }
                _ => state.previous_ca_pem = None,
            },
            None => {}
        }
    } else if let Some(t) = state.leaf_switched_at {
        deadlines.push(t + spec.propagation);
    }

    let mut bundle = String::new();
    if let Some(p) = &state.previous_ca_pem {
        bundle.push_str(p.trim_end());
        bundle.push('\n');
    }
    bundle.push_str(ca.cert_pem.trim_end());
    bundle.push('\n');
    let next = deadlines
        .into_iter()
        .filter(|d| *d > now)
        .min()
        .unwrap_or(now + Duration::seconds(1));
    Ok(Rotation {
        state,
        bundle,
        next,
        ca_rotated,
        leaf_rotated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            ca_common_name: "test-ca".into(),
            common_name: "svc".into(),
            dns_names: vec!["svc.ns.svc".into()],
            ips: vec![],
            ca_policy: Policy::new(Duration::seconds(60)),
            leaf_policy: Policy::new(Duration::seconds(20)),
            propagation: Duration::seconds(2),
            algorithm: KeyAlgorithm::default(),
        }
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    #[test]
    fn first_plan_issues_ca_and_leaf_and_is_stable() {
        let t0 = now();
        let p = plan(t0, &State::default(), &spec()).expect("plan");
        assert!(p.ca_rotated && p.leaf_rotated);
        assert!(p.next > t0);
        let again = plan(t0 + Duration::seconds(1), &p.state, &spec()).expect("plan");
        assert!(!again.ca_rotated && !again.leaf_rotated);
        assert_eq!(again.state, p.state, "a steady state plans no change");
    }

    #[test]
    fn every_step_of_a_ca_rotation_keeps_the_served_leaf_verifiable() {
        let s = spec();
        let mut t = now();
        let mut state = State::default();
        let mut cas = 0;
        // Walk 3 CA lifetimes in steps that follow the planner's own schedule.
        let end = t + Duration::seconds(180);
        while t < end {
            let p = plan(t, &state, &s).expect("plan");
            cas += usize::from(p.ca_rotated);
            let leaf = p.state.leaf.clone().expect("leaf");
            let trusted = crate::split_bundle(&p.bundle)
                .iter()
                .any(|ca| verify_chain(&leaf.cert_pem, ca, "svc.ns.svc", t).is_ok());
            assert!(
                trusted,
                "at {t}: the served leaf is not verifiable with the bundle"
            );
            // The bundle that clients had before this step must verify the new leaf too, unless the
            // planner waited for propagation.
            state = p.state;
            t = p.next.max(t + Duration::milliseconds(200));
        }
        assert!(cas >= 3, "the CA rotated {cas} times");
    }

    #[test]
    fn a_previous_ca_stays_only_for_the_rotation_window() {
        let s = spec();
        let t0 = now();
        let first = plan(t0, &State::default(), &s).expect("plan");
        let other = new_ca(&s, t0).expect("another CA");
        // A previous CA next to a leaf of the current CA, with no switch recorded (the record lost or
        // written by hand): kept until two propagation times after the current CA, then dropped.
        let stuck = State {
            previous_ca_pem: Some(other.cert_pem.clone()),
            ca_created_at: Some(t0),
            leaf_switched_at: None,
            ..first.state.clone()
        };
        let within = plan(t0 + Duration::seconds(1), &stuck, &s).expect("plan");
        assert!(within.bundle.contains(other.cert_pem.trim_end()));
        assert!(within.next <= t0 + s.propagation * 2);
        let after = plan(t0 + s.propagation * 2, &stuck, &s).expect("plan");
        assert_eq!(after.state.previous_ca_pem, None);
        assert!(!after.bundle.contains(other.cert_pem.trim_end()));
        // No record of when the current CA was made: no window at all.
        let unrecorded = State {
            ca_created_at: None,
            ..stuck.clone()
        };
        let p = plan(t0 + Duration::seconds(1), &unrecorded, &s).expect("plan");
        assert_eq!(p.state.previous_ca_pem, None);
        // An expired previous CA is dropped whatever the records say.
        let expired = crate::Ca::generate(
            "old",
            t0 - Duration::hours(2),
            t0 - Duration::hours(1),
            KeyAlgorithm::default(),
        )
        .expect("expired CA");
        let p = plan(
            t0 + Duration::seconds(1),
            &State {
                previous_ca_pem: Some(expired.cert_pem.clone()),
                leaf_switched_at: Some(t0),
                ..stuck
            },
            &s,
        )
        .expect("plan");
        assert_eq!(p.state.previous_ca_pem, None);
    }
}
