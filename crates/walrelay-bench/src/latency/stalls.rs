//! Where in a run the slow events were: a p99 far above the p50 is either
//! a slow tail spread over the whole run or a few stalls in which every
//! event waited. The two have different causes (per-record cost against a
//! pause of some process), so the report names the stalls: windows of
//! commit time in which some event waited longer than a threshold.

use crate::runs::Stall;

/// Events slower than `threshold_ms`, grouped into windows of `window_s`
/// seconds of commit time (adjacent slow windows merged), the slowest
/// `keep` of them in time order. `events` are (commit time in seconds
/// after the start, wait in ms), in any order.
pub fn find(events: &[(f64, f64)], threshold_ms: f64, window_s: f64, keep: usize) -> Vec<Stall> {
    let mut slow: Vec<(f64, f64)> = events
        .iter()
        .copied()
        .filter(|(_, ms)| *ms > threshold_ms)
        .collect();
    slow.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut stalls: Vec<Stall> = Vec::new();
    let mut last_window = f64::NEG_INFINITY;
    for (at, ms) in slow {
        let window = (at / window_s).floor();
        match stalls.last_mut() {
            // The same window as the last slow event or the next: one stall.
            Some(s) if window - last_window <= 1.0 => {
                s.max_ms = s.max_ms.max(ms);
                s.slow_events += 1;
            }
            _ => stalls.push(Stall {
                at_s: window * window_s,
                max_ms: ms,
                slow_events: 1,
            }),
        }
        last_window = window;
    }
    if stalls.len() > keep {
        let mut by_size = stalls.clone();
        by_size.sort_by(|a, b| b.max_ms.total_cmp(&a.max_ms));
        let cut = by_size[keep - 1].max_ms;
        let mut kept = 0;
        stalls.retain(|s| {
            let k = s.max_ms >= cut && kept < keep;
            kept += usize::from(k);
            k
        });
    }
    stalls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiet_run_has_no_stalls() {
        let events: Vec<(f64, f64)> = (0..1000).map(|i| (i as f64 / 100.0, 12.0)).collect();
        assert!(find(&events, 50.0, 0.1, 5).is_empty());
    }

    #[test]
    fn one_pause_is_one_stall_with_its_worst_wait() {
        let mut events: Vec<(f64, f64)> = (0..1000).map(|i| (i as f64 / 100.0, 12.0)).collect();
        // A 200 ms pause at 4.0 s: events committed in it wait up to 200 ms.
        for i in 0..20 {
            events.push((4.0 + i as f64 / 100.0, 200.0 - i as f64 * 10.0));
        }
        let s = find(&events, 50.0, 0.1, 5);
        assert_eq!(s.len(), 1, "{s:?}");
        assert!((s[0].at_s - 4.0).abs() < 1e-9);
        assert_eq!(s[0].max_ms, 200.0);
        assert_eq!(s[0].slow_events, 15);
    }

    #[test]
    fn keeps_the_slowest_in_time_order() {
        let events = [(1.0, 60.0), (3.0, 300.0), (5.0, 70.0), (7.0, 200.0)];
        let s = find(&events, 50.0, 0.1, 2);
        let at: Vec<i64> = s.iter().map(|s| s.at_s.round() as i64).collect();
        assert_eq!(at, vec![3, 7]);
    }
}
