//! Go's value syntax, as kube-proxy's flags and config file use it: durations
//! (`time.ParseDuration` / `Duration.String`: `1h2m3.5s`, `500ms`, `10us`, `0`) and
//! booleans (`strconv.ParseBool`). Here rather than in the binary because each data
//! plane's own flags (the binary's `config::mode_flags`) are written in this syntax.
//!
//! Entry points: [`parse_go_duration`] (non-negative, to a [`Duration`]),
//! [`parse_go_duration_nanos`] (signed, exactly Go's accepted set and range),
//! [`format_go_duration`], [`parse_duration_arg`] and [`parse_go_bool`] (clap value
//! parsers). `humantime` is not used because its grammar differs from
//! Go's (spaces, `min`, no bare-`0` rule, different fraction handling).

use std::fmt;
use std::time::Duration;

/// Why a string is not a Go duration. The message matches Go's wording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationError(String);

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DurationError {}

const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000 * NANOSECOND;
const MILLISECOND: u64 = 1_000 * MICROSECOND;
const SECOND: u64 = 1_000 * MILLISECOND;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => NANOSECOND,
        // Go accepts both the micro sign (U+00B5) and the Greek mu (U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => MICROSECOND,
        "ms" => MILLISECOND,
        "s" => SECOND,
        "m" => MINUTE,
        "h" => HOUR,
        _ => return None,
    })
}

/// Parses Go duration syntax into signed nanoseconds, accepting exactly what Go's
/// `time.ParseDuration` accepts (including its range, ±~292 years, and its
/// truncation of fractions below a nanosecond).
pub fn parse_go_duration_nanos(orig: &str) -> Result<i64, DurationError> {
    let invalid = || DurationError(format!("time: invalid duration {orig:?}"));
    let mut s = orig;
    let mut neg = false;
    if let Some(rest) = s.strip_prefix('-') {
        neg = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    const LIMIT: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !s.is_empty() {
        let b = s.as_bytes();
        if !(b[0] == b'.' || b[0].is_ascii_digit()) {
            return Err(invalid());
        }
        let (mut v, rest) = leading_int(s).ok_or_else(invalid)?;
        let pre = rest.len() != s.len();
        s = rest;
        let (mut f, mut scale, mut post) = (0u64, 1f64, false);
        if let Some(rest) = s.strip_prefix('.') {
            let (ff, sc, rest2) = leading_fraction(rest);
            post = rest2.len() != rest.len();
            (f, scale, s) = (ff, sc, rest2);
        }
        if !pre && !post {
            return Err(invalid());
        }
        let unit_len = s
            .bytes()
            .position(|c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return Err(DurationError(format!(
                "time: missing unit in duration {orig:?}"
            )));
        }
        let (u, rest) = s.split_at(unit_len);
        s = rest;
        let unit = unit_nanos(u).ok_or_else(|| {
            DurationError(format!("time: unknown unit {u:?} in duration {orig:?}"))
        })?;
        if v > LIMIT / unit {
            return Err(invalid());
        }
        v *= unit;
        if f > 0 {
            // Go computes the fraction in float64 (exact to the nanosecond for every
            // unit up to hours); doing the same keeps results bit-identical.
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > LIMIT {
                return Err(invalid());
            }
        }
        total += v;
        if total > LIMIT {
            return Err(invalid());
        }
    }
    if neg {
        // total ≤ 2^63, so this is at least i64::MIN.
        return Ok((total as i128).wrapping_neg() as i64);
    }
    if total > LIMIT - 1 {
        return Err(invalid());
    }
    Ok(total as i64)
}

/// Consumes `[0-9]*`; `None` on overflow past 2^63 (Go's "bad [0-9]*").
fn leading_int(s: &str) -> Option<(u64, &str)> {
    let mut x: u64 = 0;
    let mut i = 0;
    for c in s.bytes() {
        if !c.is_ascii_digit() {
            break;
        }
        if x > (1 << 63) / 10 {
            return None;
        }
        x = x * 10 + u64::from(c - b'0');
        if x > 1 << 63 {
            return None;
        }
        i += 1;
    }
    Some((x, &s[i..]))
}

/// Consumes `[0-9]*` after a decimal point; digits past what fits are dropped, as in Go.
fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let (mut x, mut scale, mut overflow) = (0u64, 1f64, false);
    let mut i = 0;
    for c in s.bytes() {
        if !c.is_ascii_digit() {
            break;
        }
        i += 1;
        if overflow {
            continue;
        }
        if x > ((1u64 << 63) - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + u64::from(c - b'0');
        if y > 1 << 63 {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[i..])
}

/// Parses a Go duration that must not be negative (every kube-proxy duration is
/// validated as `>= 0` anyway, and [`Duration`] cannot hold a negative one).
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let nanos = parse_go_duration_nanos(s)?;
    if nanos < 0 {
        return Err(DurationError(format!(
            "invalid duration {s:?}: must not be negative"
        )));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

/// Formats like Go's `Duration.String()`: `0s`, `500ms`, `1.5µs`, `1m30s`, `24h0m0s`.
pub fn format_go_duration(d: Duration) -> String {
    let u = d.as_nanos();
    if u == 0 {
        return "0s".to_string();
    }
    let second = u128::from(SECOND);
    if u < second {
        let (prec, unit) = if u < u128::from(MICROSECOND) {
            (0, "ns")
        } else if u < u128::from(MILLISECOND) {
            (3, "\u{b5}s")
        } else {
            (6, "ms")
        };
        let (int, frac) = split_frac(u, prec);
        return format!("{int}{frac}{unit}");
    }
    let (secs, frac) = split_frac(u, 9);
    let (mins, secs) = (secs / 60, secs % 60);
    if mins == 0 {
        return format!("{secs}{frac}s");
    }
    let (hours, mins) = (mins / 60, mins % 60);
    if hours == 0 {
        return format!("{mins}m{secs}{frac}s");
    }
    format!("{hours}h{mins}m{secs}{frac}s")
}

/// Splits `v` into `v / 10^prec` and the fraction as `.ddd` without trailing zeros
/// (empty when the fraction is zero), like Go's `fmtFrac`.
fn split_frac(v: u128, prec: u32) -> (u128, String) {
    let p = 10u128.pow(prec);
    let (int, frac) = (v / p, v % p);
    if frac == 0 {
        return (int, String::new());
    }
    let digits = format!("{frac:0width$}", width = prec as usize);
    (int, format!(".{}", digits.trim_end_matches('0')))
}

/// A Go-syntax duration as a config-file value (`metav1.Duration`): a string such as
/// `"30s"` on the wire. Negative values are rejected at parse time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GoDuration(pub Duration);

impl<'de> serde::Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_go_duration(&s)
            .map(GoDuration)
            .map_err(serde::de::Error::custom)
    }
}

impl serde::Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_go_duration(self.0))
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_go_duration(self.0))
    }
}

/// [`parse_go_duration`] as a clap value parser.
pub fn parse_duration_arg(s: &str) -> Result<Duration, String> {
    parse_go_duration(s).map_err(|e| e.to_string())
}

/// Go's `strconv.ParseBool`, which pflag uses for `--flag=VALUE` on boolean flags.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?} (use true or false)")),
    }
}

/// A clap value parser for a whole number from `lo` to `hi`, with its errors in
/// words ("not a whole number", "must be from 0 to 31") rather than Rust's. clap
/// names the flag and quotes the value.
pub fn whole_number<T>(
    lo: i64,
    hi: i64,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<i64>,
{
    move |s: &str| {
        let n: i64 = s
            .trim()
            .parse()
            .map_err(|_| "not a whole number".to_string())?;
        if n < lo || n > hi {
            return Err(format!("must be from {lo} to {hi}"));
        }
        T::try_from(n).map_err(|_| format!("must be from {lo} to {hi}"))
    }
}

/// A clap value parser for a number (decimals allowed), as Go's `ParseFloat`.
pub fn parse_number(s: &str) -> Result<f32, String> {
    match s.trim().parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err("not a number".to_string()),
    }
}

/// serde's error text in the words of a manifest's or config file's author: Rust's
/// type names (`expected i32`, `expected f32`, `expected a sequence`, `struct X`)
/// become what a YAML value is (`a whole number from -2147483648 to 2147483647`, `a
/// number`, `a list`, `an object`), and backquotes around a value go.
pub fn plain_serde_message(msg: &str) -> String {
    let ints: [(&str, &str); 10] = [
        ("i8", "a whole number from -128 to 127"),
        ("i16", "a whole number from -32768 to 32767"),
        ("i32", "a whole number from -2147483648 to 2147483647"),
        ("i64", "a whole number"),
        ("u8", "a whole number from 0 to 255"),
        ("u16", "a whole number from 0 to 65535"),
        ("u32", "a whole number from 0 to 4294967295"),
        ("u64", "a whole number from 0 up"),
        ("usize", "a whole number from 0 up"),
        ("isize", "a whole number"),
    ];
    let mut out = msg.replace('`', "");
    for (ty, words) in ints {
        out = replace_word(
            &out,
            &format!("expected {ty}"),
            &format!("expected {words}"),
        );
    }
    for (from, to) in [
        ("expected f32", "expected a number"),
        ("expected f64", "expected a number"),
        ("expected a sequence", "expected a list"),
        ("expected a map", "expected an object"),
        ("expected a borrowed string", "expected a string"),
        ("invalid type: sequence", "invalid type: list"),
        ("invalid type: map", "invalid type: object"),
        ("invalid type: unit value", "invalid type: null"),
        ("invalid type: floating point", "invalid type: number"),
    ] {
        out = replace_word(&out, from, to);
    }
    // "expected struct ServiceSpec" (a derived type's name): an object.
    while let Some(i) = out.find("expected struct ") {
        let rest = &out[i + "expected struct ".len()..];
        let end = rest
            .find(|c: char| !c.is_alphanumeric() && c != '_')
            .unwrap_or(rest.len());
        out = format!("{}expected an object{}", &out[..i], &rest[end..]);
    }
    out
}

/// `text` with `from` replaced where it is not followed by a letter, digit or `_`
/// (so that `expected u8` does not match inside `expected u8x`).
fn replace_word(text: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(from) {
        let after = &rest[i + from.len()..];
        let whole = !after.starts_with(|c: char| c.is_alphanumeric() || c == '_');
        out.push_str(&rest[..i]);
        out.push_str(if whole { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> i64 {
        parse_go_duration_nanos(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    #[test]
    fn parses_go_syntax() {
        // Cases from Go's time package tests.
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("5s", 5 * SECOND as i64),
            ("30s", 30 * SECOND as i64),
            ("1478s", 1478 * SECOND as i64),
            ("-5s", -5 * SECOND as i64),
            ("+5s", 5 * SECOND as i64),
            ("-0", 0),
            ("+0", 0),
            ("5.0s", 5 * SECOND as i64),
            ("5.6s", 5 * SECOND as i64 + 600 * MILLISECOND as i64),
            ("5.s", 5 * SECOND as i64),
            (".5s", 500 * MILLISECOND as i64),
            ("1.0s", SECOND as i64),
            ("1.00s", SECOND as i64),
            ("1.004s", SECOND as i64 + 4 * MILLISECOND as i64),
            ("1.0040s", SECOND as i64 + 4 * MILLISECOND as i64),
            ("100.00100s", 100 * SECOND as i64 + MILLISECOND as i64),
            ("10ns", 10),
            ("11us", 11 * MICROSECOND as i64),
            ("12µs", 12 * MICROSECOND as i64),
            ("12μs", 12 * MICROSECOND as i64),
            ("13ms", 13 * MILLISECOND as i64),
            ("14s", 14 * SECOND as i64),
            ("15m", 15 * MINUTE as i64),
            ("16h", 16 * HOUR as i64),
            ("3h30m", (3 * HOUR + 30 * MINUTE) as i64),
            (
                "1h2m3.5s",
                (HOUR + 2 * MINUTE + 3 * SECOND + 500 * MILLISECOND) as i64,
            ),
            ("1m30s", 90 * SECOND as i64),
            (
                "10.5s4m",
                (4 * MINUTE + 10 * SECOND + 500 * MILLISECOND) as i64,
            ),
            (
                "-2m3.4s",
                -((2 * MINUTE + 3 * SECOND + 400 * MILLISECOND) as i64),
            ),
            (
                "1h2m3s4ms5us6ns",
                (HOUR + 2 * MINUTE + 3 * SECOND + 4 * MILLISECOND + 5 * MICROSECOND + 6) as i64,
            ),
            (
                "39h9m14.425s",
                (39 * HOUR + 9 * MINUTE + 14 * SECOND + 425 * MILLISECOND) as i64,
            ),
            ("52763797000ns", 52763797000),
            ("0.3333333333333333333h", 20 * MINUTE as i64),
            ("9007199254740993ns", (1 << 53) + 1),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036854775.807us", i64::MAX),
            ("9223372036s854ms775us807ns", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("-9223372036854775.808us", i64::MIN),
            ("-2562047h47m16.854775808s", i64::MIN),
            ("0.100000000000000000000h", 6 * MINUTE as i64),
            (
                "0.830103483285477580700h",
                (49 * MINUTE + 48 * SECOND) as i64 + 372539827,
            ),
        ];
        for &(s, want) in cases {
            assert_eq!(ns(s), want, "{s:?}");
        }
    }

    #[test]
    fn rejects_what_go_rejects() {
        for s in [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "\u{85}\u{85}",
            "\u{FFFD}",
            "1 s",
            " 1s",
            "1s ",
            "1.5.s",
            "1sm",
            "9223372036854775808ns",
            "9223372036854775.808us",
            "9223372036854ms775us808ns",
            "-9223372036854775809ns",
            "1e3s",
            "10",
            "100000000000000000000h",
        ] {
            assert!(
                parse_go_duration_nanos(s).is_err(),
                "{s:?} should be rejected"
            );
        }
        let e = parse_go_duration_nanos("3").unwrap_err().to_string();
        assert_eq!(e, r#"time: missing unit in duration "3""#);
        let e = parse_go_duration_nanos("1d").unwrap_err().to_string();
        assert_eq!(e, r#"time: unknown unit "d" in duration "1d""#);
    }

    #[test]
    fn non_negative_wrapper() {
        assert_eq!(parse_go_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_go_duration("-0s").unwrap(), Duration::ZERO);
        let e = parse_go_duration("-1s").unwrap_err().to_string();
        assert!(e.contains("must not be negative"), "{e}");
    }

    #[test]
    fn formats_like_go() {
        let cases: &[(u64, &str)] = &[
            (0, "0s"),
            (1, "1ns"),
            (1100, "1.1µs"),
            (2200 * MICROSECOND, "2.2ms"),
            (3300 * MILLISECOND, "3.3s"),
            (4 * MINUTE + 5 * SECOND, "4m5s"),
            (4 * MINUTE + 5001 * MILLISECOND, "4m5.001s"),
            (5 * HOUR + 6 * MINUTE + 7001 * MILLISECOND, "5h6m7.001s"),
            (8 * MINUTE + 1, "8m0.000000001s"),
            (HOUR, "1h0m0s"),
            (24 * HOUR, "24h0m0s"),
            (15 * MINUTE, "15m0s"),
            (30 * SECOND, "30s"),
            (500 * MILLISECOND, "500ms"),
            (i64::MAX as u64, "2562047h47m16.854775807s"),
        ];
        for &(n, want) in cases {
            let d = Duration::from_nanos(n);
            assert_eq!(format_go_duration(d), want);
            assert_eq!(parse_go_duration(want).unwrap(), d, "round trip {want}");
        }
    }

    #[test]
    fn serde_as_string() {
        let d: GoDuration = serde_json::from_str(r#""1m30s""#).unwrap();
        assert_eq!(d.0, Duration::from_secs(90));
        assert_eq!(serde_json::to_string(&d).unwrap(), r#""1m30s""#);
        assert!(serde_json::from_str::<GoDuration>("30").is_err());
        assert!(serde_json::from_str::<GoDuration>(r#""-1s""#).is_err());
    }

    #[test]
    fn numbers_are_refused_in_words() {
        let bit = whole_number::<u8>(0, 31);
        assert_eq!(bit("14"), Ok(14));
        assert_eq!(bit("40"), Err("must be from 0 to 31".to_string()));
        assert_eq!(bit("x"), Err("not a whole number".to_string()));
        let adj = whole_number::<i32>(-1000, 1000);
        assert_eq!(adj("-999"), Ok(-999));
        assert!(adj("5000").unwrap_err().contains("from -1000 to 1000"));
        assert_eq!(parse_number("2.5"), Ok(2.5));
        assert_eq!(parse_number("abc"), Err("not a number".to_string()));
        assert!(parse_number("NaN").is_err());
    }

    #[test]
    fn serde_messages_lose_their_rust_words() {
        assert_eq!(
            plain_serde_message(r#"invalid type: string "abc", expected i32"#),
            r#"invalid type: string "abc", expected a whole number from -2147483648 to 2147483647"#
        );
        assert_eq!(
            plain_serde_message("invalid value: integer `-1`, expected u32"),
            "invalid value: integer -1, expected a whole number from 0 to 4294967295"
        );
        assert_eq!(
            plain_serde_message(r#"invalid type: string "x", expected f32"#),
            r#"invalid type: string "x", expected a number"#
        );
        assert_eq!(
            plain_serde_message("invalid type: sequence, expected struct ServiceSpec"),
            "invalid type: list, expected an object"
        );
        assert_eq!(plain_serde_message("expected u8x"), "expected u8x");
    }
}
