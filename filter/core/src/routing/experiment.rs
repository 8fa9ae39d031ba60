//! Sticky A/B experiments: a client key always lands in the same arm, on
//! every worker and across reloads, because the arm is a pure function of the
//! experiment's salt and the client's name (FNV-1a).

use fnv::FnvHasher;
use std::hash::Hasher;

/// Buckets an experiment's weights are spread over.
pub const BUCKETS: u64 = 10_000;

/// The bucket of a client in an experiment.
pub fn bucket(salt: &str, client: &str) -> u64 {
    let mut h = FnvHasher::default();
    h.write(salt.as_bytes());
    h.write(&[0]);
    h.write(client.as_bytes());
    h.finish() % BUCKETS
}

/// The arm index for a bucket: arms own consecutive bucket ranges in
/// proportion to their weights, so changing weights moves only the buckets
/// whose range changed.
pub fn arm_for(bucket: u64, weights: &[u32]) -> Option<usize> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    let mut acc = 0u64;
    for (i, &w) in weights.iter().enumerate() {
        acc += u64::from(w);
        if bucket < acc * BUCKETS / total {
            return Some(i);
        }
    }
    weights.iter().rposition(|&w| w > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn assignment_is_stable_and_depends_on_the_salt() {
        assert_eq!(bucket("s", "alice"), bucket("s", "alice"));
        let moved = (0..200)
            .filter(|i| bucket("s1", &format!("c{i}")) != bucket("s2", &format!("c{i}")))
            .count();
        assert!(moved > 150, "a new salt reshuffles ({moved}/200)");
    }

    #[test]
    fn arms_follow_weights_over_many_clients() {
        let n = 10_000;
        let mut counts = [0u32; 2];
        for i in 0..n {
            counts[arm_for(bucket("exp", &format!("client-{i}")), &[30, 70]).unwrap()] += 1;
        }
        // 3000 expected, sd 46: 5 sd tolerance.
        assert!((2770..=3230).contains(&counts[0]), "{counts:?}");
    }

    #[test]
    fn changing_weights_moves_only_keys_whose_bucket_changed_arms() {
        for b in 0..BUCKETS {
            let before = arm_for(b, &[50, 50]).unwrap();
            let after = arm_for(b, &[60, 40]).unwrap();
            if before != after {
                assert!((5000..6000).contains(&b), "bucket {b} moved");
                assert_eq!((before, after), (1, 0));
            }
        }
    }

    #[test]
    fn zero_weights() {
        assert_eq!(arm_for(3, &[0, 0]), None);
        assert_eq!(arm_for(9_999, &[0, 5]), Some(1));
        assert_eq!(arm_for(0, &[0, 5]), Some(1));
    }
}
