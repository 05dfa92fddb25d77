//! When to renew a certificate: a pure function of (now, notBefore, notAfter, policy). Every constant
//! derives from the configured lifetime, so a 20-second test certificate and a one-year production
//! certificate follow the same rules.

use time::{Duration, OffsetDateTime};

/// Renewal policy of one kind of certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Lifetime of newly issued certificates.
    pub lifetime: Duration,
}

impl Policy {
    /// A policy for certificates that live `lifetime`.
    pub fn new(lifetime: Duration) -> Self {
        Self { lifetime }
    }

    /// Renew after this fraction of a certificate's own lifetime has passed (two thirds).
    pub const RENEW_FRACTION_NUM: i32 = 2;
    /// Denominator of [`Policy::RENEW_FRACTION_NUM`].
    pub const RENEW_FRACTION_DEN: i32 = 3;

    /// Always renew at least this long before expiry: a sixth of the configured lifetime.
    pub fn margin(&self) -> Duration {
        self.lifetime / 6
    }

    /// Tolerated clock skew for a certificate that is not yet valid: a twentieth of the lifetime,
    /// at most five minutes.
    pub fn skew(&self) -> Duration {
        Ord::min(self.lifetime / 20_i32, Duration::minutes(5))
    }

    /// How far back a new certificate's notBefore is set, so that peers with a slightly slow clock
    /// accept it: the same as [`Policy::skew`].
    pub fn backdate(&self) -> Duration {
        self.skew()
    }

    /// Validity window of a certificate issued at `now`.
    pub fn validity(&self, now: OffsetDateTime) -> (OffsetDateTime, OffsetDateTime) {
        (now - self.backdate(), now + self.lifetime)
    }
}

/// What to do with a certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep it; renew at `renew_at`.
    Keep {
        /// When it becomes due.
        renew_at: OffsetDateTime,
    },
    /// Renew now.
    Renew(Reason),
}

/// Why a certificate must be renewed now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Past notAfter.
    Expired,
    /// notBefore is further in the future than the tolerated clock skew.
    NotYetValid,
    /// Its renewal time has come.
    Due,
    /// Its validity window is empty or inverted.
    Malformed,
}

/// Decides whether a certificate valid from `not_before` to `not_after` must be renewed at `now`.
pub fn decide(
    now: OffsetDateTime,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    policy: &Policy,
) -> Decision {
    if not_after <= not_before {
        return Decision::Renew(Reason::Malformed);
    }
    if now >= not_after {
        return Decision::Renew(Reason::Expired);
    }
    if not_before - policy.skew() > now {
        return Decision::Renew(Reason::NotYetValid);
    }
    let own_lifetime = not_after - not_before;
    let by_fraction =
        not_before + own_lifetime * Policy::RENEW_FRACTION_NUM / Policy::RENEW_FRACTION_DEN;
    let by_margin = not_after - policy.margin();
    let renew_at = by_fraction.min(by_margin);
    if now >= renew_at {
        Decision::Renew(Reason::Due)
    } else {
        Decision::Keep { renew_at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + Duration::days(20000) + Duration::seconds(secs)
    }

    fn day() -> Policy {
        Policy::new(Duration::days(1))
    }

    #[test]
    fn fresh_certificate_is_kept_until_two_thirds() {
        let p = day();
        let (nb, na) = (t(0), t(86400));
        assert_eq!(
            decide(t(10), nb, na, &p),
            Decision::Keep { renew_at: t(57600) }
        );
        assert_eq!(decide(t(57600), nb, na, &p), Decision::Renew(Reason::Due));
    }

    #[test]
    fn expired_and_exactly_expired() {
        let p = day();
        assert_eq!(
            decide(t(86400), t(0), t(86400), &p),
            Decision::Renew(Reason::Expired)
        );
        assert_eq!(
            decide(t(99999), t(0), t(86400), &p),
            Decision::Renew(Reason::Expired)
        );
    }

    #[test]
    fn not_yet_valid_within_and_beyond_skew() {
        let p = day();
        // skew = min(1 day / 20, 5 min) = 5 min
        assert_eq!(p.skew(), Duration::minutes(5));
        assert!(
            matches!(decide(t(0), t(200), t(86400), &p), Decision::Keep { .. }),
            "a 200 s skew is tolerated"
        );
        assert_eq!(
            decide(t(0), t(400), t(86400), &p),
            Decision::Renew(Reason::NotYetValid)
        );
    }

    #[test]
    fn margin_wins_for_long_foreign_certificates() {
        // A certificate issued elsewhere for a year under a one-day policy is renewed a margin
        // (4 h) before it expires, not after two thirds of its year... whichever is earlier.
        let p = day();
        let d = decide(t(0), t(0), t(365 * 86400), &p);
        assert_eq!(
            d,
            Decision::Keep {
                renew_at: t(365 * 86400 * 2 / 3)
            }
        );
        // A short foreign certificate: the margin comes first.
        let d = decide(t(0), t(0), t(5 * 3600), &p);
        assert_eq!(d, Decision::Keep { renew_at: t(3600) });
    }

    #[test]
    fn tiny_lifetimes() {
        let p = Policy::new(Duration::seconds(20));
        assert_eq!(p.margin(), Duration::seconds(20) / 6);
        assert_eq!(p.skew(), Duration::seconds(1));
        let (nb, na) = p.validity(t(0));
        assert_eq!((nb, na), (t(-1), t(20)));
        match decide(t(0), nb, na, &p) {
            Decision::Keep { renew_at } => {
                assert!(renew_at > t(0) && renew_at < na - p.margin() + Duration::milliseconds(1))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            decide(t(0), t(5), t(5), &p),
            Decision::Renew(Reason::Malformed)
        );
        let zero = Policy::new(Duration::ZERO);
        assert_eq!(zero.margin(), Duration::ZERO);
        assert_eq!(
            decide(t(0), t(0), t(1), &zero),
            Decision::Keep {
                renew_at: t(0) + Duration::seconds(2) / 3
            }
        );
        assert_eq!(
            decide(t(1), t(0), t(1), &zero),
            Decision::Renew(Reason::Expired)
        );
    }

    #[test]
    fn huge_lifetimes_do_not_overflow() {
        let p = Policy::new(Duration::days(365 * 100));
        let (nb, na) = p.validity(t(0));
        assert!(matches!(decide(t(60), nb, na, &p), Decision::Keep { .. }));
    }

    #[test]
    fn clock_skew_backwards_after_issuance() {
        // The clock jumps back an hour after issuance: the certificate is kept, renewal time unchanged.
        let p = day();
        let (nb, na) = p.validity(t(0));
        let before = decide(t(10), nb, na, &p);
        let after = decide(t(10 - 3600), nb, na, &p);
        assert_eq!(
            after,
            Decision::Renew(Reason::NotYetValid),
            "an hour is beyond the tolerated skew"
        );
        assert!(matches!(before, Decision::Keep { .. }));
    }
}
