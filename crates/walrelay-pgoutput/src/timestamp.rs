//! PostgreSQL timestamps as sent by pgoutput.
//!
//! pgoutput sends `TimestampTz` values as microseconds since the PostgreSQL
//! epoch, 2000-01-01 00:00:00 UTC. We keep that raw integer (lossless, cheap,
//! `Ord`) and convert to [`SystemTime`] only when someone asks, because most
//! consumers just forward the number or compare it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds from the Unix epoch (1970-01-01) to the PostgreSQL epoch
/// (2000-01-01).
pub const PG_EPOCH_UNIX_SECS: u64 = 946_684_800;

/// A `TimestampTz`: microseconds since 2000-01-01 00:00:00 UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    /// The PostgreSQL epoch itself (2000-01-01 00:00:00 UTC).
    pub const PG_EPOCH: PgTimestamp = PgTimestamp(0);

    /// Raw microseconds since 2000-01-01.
    #[must_use]
    pub const fn micros(self) -> i64 {
        self.0
    }

    /// Microseconds since the Unix epoch (1970-01-01). Computed in `i128`
    /// so no input can overflow.
    #[must_use]
    pub const fn unix_micros(self) -> i128 {
        self.0 as i128 + PG_EPOCH_UNIX_SECS as i128 * 1_000_000
    }

    /// Converts to [`SystemTime`].
    ///
    /// Returns `None` for PostgreSQL's `-infinity` / `infinity`
    /// (`i64::MIN` / `i64::MAX`) and for values the platform's `SystemTime`
    /// cannot represent, instead of panicking like `UNIX_EPOCH + d` would.
    #[must_use]
    pub fn to_system_time(self) -> Option<SystemTime> {
        if self.0 == i64::MIN || self.0 == i64::MAX {
            return None;
        }
        let unix = self.unix_micros();
        let magnitude = Duration::from_micros(u64::try_from(unix.unsigned_abs()).ok()?);
        if unix >= 0 {
            UNIX_EPOCH.checked_add(magnitude)
        } else {
            UNIX_EPOCH.checked_sub(magnitude)
        }
    }

    /// Converts from [`SystemTime`], or `None` if it does not fit in `i64`
    /// microseconds since 2000 (hundreds of thousands of years away).
    #[must_use]
    pub fn from_system_time(time: SystemTime) -> Option<PgTimestamp> {
        let unix: i128 = match time.duration_since(UNIX_EPOCH) {
            Ok(after) => i128::try_from(after.as_micros()).ok()?,
            Err(before) => -i128::try_from(before.duration().as_micros()).ok()?,
        };
        let pg = unix - i128::from(PG_EPOCH_UNIX_SECS) * 1_000_000;
        i64::try_from(pg).ok().map(PgTimestamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_epoch_is_year_2000() {
        assert_eq!(
            PgTimestamp::PG_EPOCH.to_system_time(),
            Some(UNIX_EPOCH + Duration::from_secs(946_684_800))
        );
        // 2024-01-01 00:00:00 UTC = 1704067200 Unix seconds.
        let ts = PgTimestamp((1_704_067_200 - 946_684_800) * 1_000_000 + 5);
        assert_eq!(
            ts.to_system_time(),
            Some(UNIX_EPOCH + Duration::from_secs(1_704_067_200) + Duration::from_micros(5))
        );
        assert_eq!(
            PgTimestamp::from_system_time(ts.to_system_time().unwrap()),
            Some(ts)
        );
    }

    #[test]
    fn before_unix_epoch_and_extremes() {
        let ts = PgTimestamp(-946_684_800 * 1_000_000 - 1);
        assert_eq!(
            ts.to_system_time(),
            Some(UNIX_EPOCH - Duration::from_micros(1))
        );
        assert_eq!(PgTimestamp(i64::MAX).to_system_time(), None);
        assert_eq!(PgTimestamp(i64::MIN).to_system_time(), None);
        // Near-extreme values never panic.
        let _ = PgTimestamp(i64::MAX - 1).to_system_time();
        let _ = PgTimestamp(i64::MIN + 1).to_system_time();
    }
}
