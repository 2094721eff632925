//! The counter-based random generator behind `Op::Random`.
//!
//! Element `i` of a fill with key `k` is `mix(k + (i + 1) * GAMMA)`: SplitMix64 read at an
//! arbitrary position instead of stepped. Every element is independent of the order in which
//! elements are computed, so the reference executor, a fused kernel split over threads and a
//! GPU kernel all produce the same values for the same key.

/// SplitMix64's increment (the odd integer closest to 2^64 / phi).
pub const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finalizer: a bijective mix of 64 bits.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The raw 64 random bits of element `index` of stream `key`.
pub fn bits(key: u64, index: u64) -> u64 {
    mix64(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// A uniform value in `[0, 1)` with `precision` random bits (at most 53): a multiple of
/// `2^-precision`, so that a float type with that many significand bits holds it exactly and
/// rounding can never produce 1.
pub fn uniform(key: u64, index: u64, precision: u32) -> f64 {
    let precision = precision.clamp(1, 53);
    (bits(key, index) >> (64 - precision)) as f64 * (-f64::from(precision)).exp2()
}

/// A standard normal value (Box-Muller over two independent uniforms of the stream).
pub fn normal(key: u64, index: u64) -> f64 {
    // 1 - u lies in (0, 1], so the logarithm is finite.
    let u1 = 1.0 - uniform(key, 2 * index, 53);
    let u2 = uniform(key, 2 * index + 1, 53);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A uniform integer in `[low, high)` (`low < high`), by Lemire's multiply-shift.
pub fn int(key: u64, index: u64, low: i64, high: i64) -> i64 {
    let range = high.wrapping_sub(low) as u64;
    let pick = ((u128::from(bits(key, index)) * u128::from(range)) >> 64) as u64;
    low.wrapping_add(pick as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_right() {
        let n = 200_000u64;
        let (mut su, mut sn, mut sn2) = (0.0, 0.0, 0.0);
        for i in 0..n {
            let u = uniform(7, i, 53);
            assert!(uniform(7, i, 24) < 1.0);
            assert!((0.0..1.0).contains(&u));
            su += u;
            let z = normal(7, i);
            sn += z;
            sn2 += z * z;
        }
        let nf = n as f64;
        assert!((su / nf - 0.5).abs() < 0.005);
        assert!((sn / nf).abs() < 0.01);
        assert!((sn2 / nf - 1.0).abs() < 0.01);
    }

    #[test]
    fn ints_cover_their_range() {
        let mut seen = [0usize; 7];
        for i in 0..7000 {
            let v = int(3, i, -3, 4);
            seen[(v + 3) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 800), "{seen:?}");
    }
}
