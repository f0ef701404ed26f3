//! Integer helpers the per-node placement arithmetic shares. Scores and needs are computed in
//! 128 bits so no product can overflow, but a 128-bit division is a library call several
//! times slower than the hardware's 64-bit one, and filter and prioritize divide for every
//! candidate node; the values nearly always fit 64 bits.

/// `a / b` (truncating, as `i128`'s `/`), in 64-bit hardware division whenever both fit.
#[inline]
pub fn div(a: i128, b: i128) -> i128 {
    match (i64::try_from(a), i64::try_from(b)) {
        // `i64::MIN / -1` overflows 64 bits (not 128): leave that one to the wide division.
        (Ok(a), Ok(b)) if !(a == i64::MIN && b == -1) => i128::from(a / b),
        _ => a / b,
    }
}

#[cfg(test)]
mod tests {
    use super::div;

    #[test]
    fn equals_the_wide_division() {
        let big = i128::from(i64::MAX) * 1000;
        for (a, b) in [
            (7, 2),
            (-7, 2),
            (7, -2),
            (0, 5),
            (i128::from(i64::MAX), 3),
            (i128::from(i64::MIN), -1),
            (i128::from(i64::MIN), 1),
            (big, 7),
            (big, big / 3),
            (-big, 1000),
        ] {
            assert_eq!(div(a, b), a / b, "{a} / {b}");
        }
    }
}
