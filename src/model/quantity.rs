//! Kubernetes resource quantities (`"80Gi"`, `"500m"`, `"1e3"`), parsed exactly.
//!
//! Values are held as thousandths (milli-units) in an `i128`, which is exact for every suffix
//! from `m` up to `Ei` without floating point. `value()` rounds up like apimachinery's
//! `Quantity.Value()`, so a fractional request is never under-counted.

use std::fmt;

/// An exact quantity in milli-units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    milli: i128,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty quantity")]
    Empty,
    #[error(
        "invalid quantity {0:?}: expected a number with an optional suffix such as 500m, 2, 16Gi or 1e3"
    )]
    Invalid(String),
    #[error("quantity {0:?} is out of range")]
    OutOfRange(String),
    #[error("quantity {0:?} is more precise than a thousandth")]
    TooPrecise(String),
}

impl Quantity {
    pub const ZERO: Quantity = Quantity { milli: 0 };

    pub fn from_milli(milli: i128) -> Self {
        Quantity { milli }
    }
    pub fn from_units(units: i64) -> Self {
        Quantity {
            milli: units as i128 * 1000,
        }
    }
    pub fn milli(&self) -> i128 {
        self.milli
    }
    /// Whole units, rounded up (apimachinery `Value()`), saturating at `i64` bounds.
    pub fn value(&self) -> i64 {
        let v = self.milli.div_euclid(1000) + i128::from(self.milli.rem_euclid(1000) != 0);
        v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }
    /// Milli-units, saturating at `i64` bounds.
    pub fn milli_value(&self) -> i64 {
        self.milli.clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }
    pub fn is_zero(&self) -> bool {
        self.milli == 0
    }

    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let s = input.trim();
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let invalid = || QuantityError::Invalid(input.to_string());
        let range = || QuantityError::OutOfRange(input.to_string());
        let (negative, body) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (number, suffix) = body.split_at(num_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(invalid());
        }
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        // Value as digits / 10^frac_len. The digits are read in place: this runs for every
        // quantity of every pod at bootstrap, so it must not allocate.
        let mut mantissa: i128 = 0;
        for b in int_part.bytes().chain(frac_part.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(b - b'0')))
                .ok_or_else(range)?;
        }
        let mut decimal_exp: i32 = -(frac_part.len() as i32);
        let mut binary_mult: i128 = 1;
        match suffix {
            "" => {}
            "n" => decimal_exp -= 9,
            "u" => decimal_exp -= 6,
            "m" => decimal_exp -= 3,
            "k" => decimal_exp += 3,
            "M" => decimal_exp += 6,
            "G" => decimal_exp += 9,
            "T" => decimal_exp += 12,
            "P" => decimal_exp += 15,
            "E" => decimal_exp += 18,
            "Ki" => binary_mult = 1 << 10,
            "Mi" => binary_mult = 1 << 20,
            "Gi" => binary_mult = 1 << 30,
            "Ti" => binary_mult = 1 << 40,
            "Pi" => binary_mult = 1 << 50,
            "Ei" => binary_mult = 1 << 60,
            _ => {
                let exp = suffix
                    .strip_prefix(['e', 'E'])
                    .ok_or_else(invalid)?
                    .parse::<i32>()
                    .map_err(|_| invalid())?;
                if !(-30..=30).contains(&exp) {
                    return Err(range());
                }
                decimal_exp += exp;
            }
        }
        // milli = mantissa * binary_mult * 10^(decimal_exp + 3)
        let mut milli = mantissa.checked_mul(binary_mult).ok_or_else(range)?;
        let shift = decimal_exp + 3;
        if shift >= 0 {
            let p = 10i128.checked_pow(shift as u32).ok_or_else(range)?;
            milli = milli.checked_mul(p).ok_or_else(range)?;
        } else {
            let p = 10i128
                .checked_pow((-shift) as u32)
                .ok_or_else(|| QuantityError::TooPrecise(input.to_string()))?;
            // Round up, like apimachinery does when scaling to a coarser unit.
            milli = milli / p + i128::from(milli % p != 0);
        }
        if milli > i64::MAX as i128 * 1000 {
            return Err(range());
        }
        Ok(Quantity {
            milli: if negative { -milli } else { milli },
        })
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl fmt::Display for Quantity {
    /// Canonical-enough form: whole units when exact, else milli-units with `m`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.milli % 1000 == 0 {
            write!(f, "{}", self.milli / 1000)
        } else {
            write!(f, "{}m", self.milli)
        }
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;
    fn add(self, o: Quantity) -> Quantity {
        Quantity {
            milli: self.milli.saturating_add(o.milli),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_forms() {
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(q("1").milli(), 1000);
        assert_eq!(q("500m").milli(), 500);
        assert_eq!(q("1.5").milli(), 1500);
        assert_eq!(q("16Gi").value(), 16 << 30);
        assert_eq!(q("80Gi").value(), 80 << 30);
        assert_eq!(q("1k").value(), 1000);
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("2E2").value(), 200);
        assert_eq!(q("0.5Gi").value(), 1 << 29);
        assert_eq!(q("100n").milli(), 1, "sub-milli rounds up");
        assert_eq!(q("1500m").value(), 2, "value() rounds up");
        assert_eq!(q("-2").value(), -2);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "abc",
            "1.2.3",
            "1X",
            "Gi",
            ".",
            "1e",
            "1e99",
            "99999999999999999999999999999999999999999",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
