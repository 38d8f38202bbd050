//! The pod-template-hash exactly as upstream's `ComputeHash` (pkg/controller/controller_utils.go):
//! FNV-32a over the template printed by go-spew (`%#v`, sorted keys, no methods: apimachinery's
//! `dump.ForHash`), then the collision count (4 bytes little-endian and 4 zero bytes), then the
//! decimal sum written in the "safe" alphabet (`rand.SafeEncodeString`).
//!
//! The printer walks the template's JSON along the Go layout of Kubernetes 1.32 (`gotypes`,
//! generated from the API definitions): field order and names, Go type names, and the zero value
//! of whatever the JSON leaves out. The template is taken as the controller manager sees it,
//! decoded from protobuf: empty lists and maps are nil, quantities are parsed from their
//! canonical form. Limits (both rare in templates): timestamps print as UTC (Go prints the
//! manager's local zone), and quantities beyond int64 precision print without their big-decimal
//! value.

use std::fmt::Write;

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;

use super::gotypes;

/// A Go type expression.
#[derive(Debug, Clone, Copy)]
pub(super) enum Ty {
    Basic(&'static str),
    /// A named type by key (`core.PodSpec`, `meta.Time`, `resource.Quantity`, ...).
    Named(&'static str),
    Ptr(&'static Ty),
    Slice(&'static Ty),
    Map(&'static Ty, &'static Ty),
}

/// A struct field: Go name, JSON name (empty for an inlined embedded struct), type.
#[derive(Debug)]
pub(super) struct Field {
    pub go: &'static str,
    pub json: &'static str,
    pub ty: Ty,
}

/// What a named type is.
#[derive(Debug)]
pub(super) enum Named {
    Struct(&'static [Field]),
    Alias(Ty),
    /// Printed by hand: Quantity, IntOrString, Time, FieldsV1.
    Special,
}

/// The hash of `template` with `collision_count`, in the safe alphabet.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let value = serde_json::to_value(template).unwrap_or(Value::Null);
    let printed = deep_print(&value);
    let mut h = Fnv32a::new();
    h.write(printed.as_bytes());
    if let Some(c) = collision_count {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&(c as u32).to_le_bytes());
        h.write(&b);
    }
    safe_encode(&h.sum().to_string())
}

/// The go-spew `%#v` print of a PodTemplateSpec given as JSON.
pub(super) fn deep_print(template: &Value) -> String {
    let mut p = Printer { out: String::new() };
    p.value(&Ty::Named("core.PodTemplateSpec"), Some(template), true);
    p.out
}

/// FNV-1a, 32 bits.
#[derive(Debug)]
struct Fnv32a(u32);

impl Fnv32a {
    fn new() -> Self {
        Self(0x811c_9dc5)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u32::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0193);
        }
    }
    fn sum(&self) -> u32 {
        self.0
    }
}

/// Upstream's `rand.SafeEncodeString`: each byte mapped into an alphabet without vowels and
/// look-alike characters, so generated names never spell words.
pub fn safe_encode(s: &str) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    s.bytes()
        .map(|b| char::from(ALPHANUMS[usize::from(b) % ALPHANUMS.len()]))
        .collect()
}

/// The Go name of a type, as `reflect.Type.String()` prints it.
fn type_name(ty: &Ty) -> String {
    match ty {
        Ty::Basic(b) => (*b).to_string(),
        Ty::Named(k) => match k.split_once('.') {
            Some(("core" | "meta", n)) => format!("v1.{n}"),
            _ => (*k).to_string(),
        },
        Ty::Ptr(t) => format!("*{}", type_name(t)),
        Ty::Slice(t) => format!("[]{}", type_name(t)),
        Ty::Map(k, v) => format!("map[{}]{}", type_name(k), type_name(v)),
    }
}

/// Present in the protobuf sense: not null, and not an empty list or map.
fn present(v: Option<&Value>) -> Option<&Value> {
    match v? {
        Value::Null => None,
        Value::Array(a) if a.is_empty() => None,
        Value::Object(o) if o.is_empty() => None,
        v => Some(v),
    }
}

struct Printer {
    out: String,
}

impl Printer {
    fn typed(&mut self, ty: &Ty, show: bool) {
        if show {
            self.out.push('(');
            self.out.push_str(&type_name(ty));
            self.out.push(')');
        }
    }

    /// spew's `format`: the value of `ty` held in `v` (absent: Go's zero value), with its type in
    /// parentheses unless `show` is false (slice elements, map keys and values, pointees).
    fn value(&mut self, ty: &Ty, v: Option<&Value>, show: bool) {
        match ty {
            Ty::Ptr(inner) => {
                let v = v.filter(|v| !v.is_null());
                match (v, show) {
                    (None, false) => self.out.push_str("<nil>"),
                    (None, true) => {
                        self.typed(ty, true);
                        self.out.push_str("<nil>");
                    }
                    (Some(v), true) => {
                        self.out.push_str("(*");
                        self.out.push_str(&type_name(inner));
                        self.out.push(')');
                        self.value(inner, Some(v), false);
                    }
                    (Some(v), false) => {
                        self.out.push_str("<*>");
                        self.value(inner, Some(v), false);
                    }
                }
            }
            Ty::Basic(b) => {
                self.typed(ty, show);
                self.basic(b, v);
            }
            Ty::Slice(elem) => {
                self.typed(ty, show);
                match present(v) {
                    Some(Value::Array(items)) => {
                        self.out.push('[');
                        for (i, item) in items.iter().enumerate() {
                            if i > 0 {
                                self.out.push(' ');
                            }
                            self.value(elem, Some(item), false);
                        }
                        self.out.push(']');
                    }
                    Some(Value::String(s)) if matches!(elem, Ty::Basic("uint8")) => {
                        // []byte travels as base64 in JSON; printed as its bytes.
                        use base64::Engine;
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(s)
                            .unwrap_or_default();
                        let parts: Vec<String> = bytes.iter().map(u8::to_string).collect();
                        let _ = write!(self.out, "[{}]", parts.join(" "));
                    }
                    _ => self.out.push_str("<nil>"),
                }
            }
            Ty::Map(k, val) => {
                self.typed(ty, show);
                self.map(k, val, v);
            }
            Ty::Named(key) => self.named(ty, key, v, show),
        }
    }

    fn map(&mut self, k: &Ty, val: &Ty, v: Option<&Value>) {
        let Some(Value::Object(m)) = present(v) else {
            self.out.push_str("<nil>");
            return;
        };
        let mut keys: Vec<&String> = m.keys().collect();
        keys.sort();
        self.out.push_str("map[");
        for (i, key) in keys.into_iter().enumerate() {
            if i > 0 {
                self.out.push(' ');
            }
            self.value(k, Some(&Value::String(key.clone())), false);
            self.out.push(':');
            self.value(val, m.get(key), false);
        }
        self.out.push(']');
    }

    fn basic(&mut self, b: &str, v: Option<&Value>) {
        let v = v.filter(|v| !v.is_null());
        match b {
            "string" => self.out.push_str(v.and_then(Value::as_str).unwrap_or_default()),
            "bool" => self.out.push_str(if v.and_then(Value::as_bool).unwrap_or(false) {
                "true"
            } else {
                "false"
            }),
            "float64" => {
                let f = v.and_then(Value::as_f64).unwrap_or(0.0);
                self.out.push_str(&format_go_float(f));
            }
            _ => {
                let n = v
                    .and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)))
                    .unwrap_or(0);
                let _ = write!(self.out, "{n}");
            }
        }
    }

    fn named(&mut self, ty: &Ty, key: &str, v: Option<&Value>, show: bool) {
        let Some(def) = gotypes::named(key) else {
            // Not in the 1.32 layout: nothing to print.
            self.typed(ty, show);
            return;
        };
        match def {
            Named::Alias(under) => {
                self.typed(ty, show);
                match under {
                    Ty::Basic(b) => self.basic(b, v),
                    Ty::Map(k, val) => self.map(k, val, v),
                    other => self.value(&other, v, false),
                }
            }
            Named::Struct(fields) => {
                self.typed(ty, show);
                self.structure(fields, v);
            }
            Named::Special => {
                self.typed(ty, show);
                match key {
                    "resource.Quantity" => self.quantity(v),
                    "intstr.IntOrString" => self.int_or_string(v),
                    "meta.Time" => self.time(v),
                    _ => self.out.push_str("{Raw:([]uint8)<nil>}"),
                }
            }
        }
    }

    fn structure(&mut self, fields: &[Field], v: Option<&Value>) {
        let obj = v.and_then(Value::as_object);
        self.out.push('{');
        for (i, f) in fields.iter().enumerate() {
            if i > 0 {
                self.out.push(' ');
            }
            self.out.push_str(f.go);
            self.out.push(':');
            let fv = if f.json.is_empty() {
                v
            } else {
                obj.and_then(|o| o.get(f.json))
            };
            self.value(&f.ty, fv, true);
        }
        self.out.push('}');
    }

    fn int_or_string(&mut self, v: Option<&Value>) {
        let (t, i, s) = match v {
            Some(Value::String(s)) => (1, 0, s.as_str()),
            Some(Value::Number(n)) => (0, n.as_i64().unwrap_or(0), ""),
            _ => (0, 0, ""),
        };
        let _ = write!(
            self.out,
            "{{Type:(intstr.Type){t} IntVal:(int32){i} StrVal:(string){s}}}"
        );
    }

    fn time(&mut self, v: Option<&Value>) {
        let t = v
            .and_then(Value::as_str)
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
        // Go's time.Time without a monotonic reading: nanoseconds in `wall`, seconds since
        // January 1, year 1 in `ext`.
        let (wall, ext) = match t {
            Some(t) => (
                u64::from(t.timestamp_subsec_nanos()),
                t.timestamp().saturating_add(62_135_596_800),
            ),
            None => (0, 0),
        };
        let _ = write!(
            self.out,
            "{{Time:(time.Time){{wall:(uint64){wall} ext:(int64){ext} loc:(*time.Location)<nil>}}}}"
        );
    }

    fn quantity(&mut self, v: Option<&Value>) {
        let text = match v {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let q = if text.is_empty() {
            Some(Quantity::default())
        } else {
            Quantity::from_stored(&text)
        };
        match q {
            Some(q) => {
                let _ = write!(
                    self.out,
                    "{{i:(resource.int64Amount){{value:(int64){} scale:(resource.Scale){}}} \
                     d:(resource.infDecAmount){{Dec:(*inf.Dec)<nil>}} s:(string){} Format:(resource.Format){}}}",
                    q.value,
                    q.scale,
                    q.cached,
                    q.format.name()
                );
            }
            None => {
                let _ = write!(
                    self.out,
                    "{{i:(resource.int64Amount){{value:(int64)0 scale:(resource.Scale)0}} \
                     d:(resource.infDecAmount){{Dec:(*inf.Dec)<nil>}} s:(string){text} Format:(resource.Format)}}"
                );
            }
        }
    }
}

/// Go's `%v` of a float64 (`strconv.FormatFloat(f, 'g', -1, 64)`) for the values templates hold.
fn format_go_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{f:.0}")
    } else {
        format!("{f}")
    }
}

/// A resource.Quantity's format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum QFormat {
    DecimalExponent,
    BinarySI,
    #[default]
    DecimalSI,
    /// The zero Quantity (no format).
    None,
}

impl QFormat {
    fn name(self) -> &'static str {
        match self {
            QFormat::DecimalExponent => "DecimalExponent",
            QFormat::BinarySI => "BinarySI",
            QFormat::DecimalSI => "DecimalSI",
            QFormat::None => "",
        }
    }
}

/// The int64 form of apimachinery's Quantity (`int64Amount` plus the cached string).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Quantity {
    value: i64,
    scale: i32,
    cached: String,
    format: QFormat,
}

impl Default for Quantity {
    fn default() -> Self {
        Self {
            value: 0,
            scale: 0,
            cached: String::new(),
            format: QFormat::None,
        }
    }
}

impl Quantity {
    /// The quantity as the controller manager decodes it after the API server's protobuf round
    /// trips (each encodes `String()`: the cached text or the canonical form). None when the
    /// value needs a big decimal.
    fn from_stored(text: &str) -> Option<Self> {
        let mut q = Self::parse(text)?;
        for _ in 0..3 {
            let next = Self::parse(&q.string()?)?;
            if next == q {
                break;
            }
            q = next;
        }
        Some(q)
    }

    /// apimachinery's `ParseQuantity`, int64 path only.
    fn parse(s: &str) -> Option<Self> {
        if s.is_empty() {
            return None;
        }
        if s == "0" {
            return Some(Self {
                value: 0,
                scale: 0,
                cached: "0".into(),
                format: QFormat::DecimalSI,
            });
        }
        let b = s.as_bytes();
        let end = b.len();
        let mut pos = 0;
        let mut positive = true;
        match b[0] {
            b'-' => {
                positive = false;
                pos = 1;
            }
            b'+' => pos = 1,
            _ => {}
        }
        while pos < end && b[pos] == b'0' {
            pos += 1;
        }
        let (num, denom, suffix);
        if pos >= end {
            num = "0".to_string();
            denom = String::new();
            suffix = String::new();
        } else {
            let start = pos;
            while pos < end && b[pos].is_ascii_digit() {
                pos += 1;
            }
            num = if pos == start {
                "0".into()
            } else {
                s[start..pos].to_string()
            };
            let mut d = String::new();
            if pos < end && b[pos] == b'.' {
                pos += 1;
                let ds = pos;
                while pos < end && b[pos].is_ascii_digit() {
                    pos += 1;
                }
                d = s[ds..pos].to_string();
            }
            denom = d;
            suffix = s[pos..].to_string();
        }
        let (base, exponent, format) = interpret_suffix(&suffix)?;
        let _ = base;
        let (mut scale, precision, mantissa) = match format {
            QFormat::BinarySI => {
                if exponent >= 0 && denom.is_empty() {
                    let p = 15 - num.len() as i32 - ((exponent as f32) * 3.0 / 10.0) as i32 - 1;
                    (0, p, 1i64.checked_shl(exponent as u32)?)
                } else {
                    (0, -1, 1)
                }
            }
            _ => (exponent, 18 - (num.len() + denom.len()) as i32, 1),
        };
        if precision < 0 {
            return None;
        }
        scale -= denom.len() as i32;
        if scale < -9 {
            return None;
        }
        let shifted = format!("{num}{denom}");
        let value: i64 = shifted.parse().ok()?;
        let mut result = value.checked_mul(mantissa)?;
        if !positive {
            result = -result;
        }
        let cache = match format {
            QFormat::BinarySI => exponent % 10 == 0 && value & 0x07 != 0,
            _ => scale % 3 == 0 && !shifted.ends_with("000") && !shifted.starts_with('0'),
        };
        Some(Self {
            value: result,
            scale,
            cached: if cache { s.to_string() } else { String::new() },
            format,
        })
    }

    /// `Quantity.String()`: the cached text, else the canonical form.
    fn string(&self) -> Option<String> {
        if !self.cached.is_empty() {
            return Some(self.cached.clone());
        }
        if self.value == 0 {
            return Some("0".into());
        }
        let mut format = self.format;
        if format == QFormat::BinarySI {
            let inexact = self.scale < 0 && !negative_scale(self.value, -self.scale).1;
            if self.is_small() || inexact {
                format = QFormat::DecimalSI;
            }
        }
        match format {
            QFormat::BinarySI => {
                let v = if self.scale >= 0 {
                    positive_scale(self.value, self.scale)?
                } else {
                    negative_scale(self.value, -self.scale).0
                };
                let (amount, times) = remove_factors(v, 1024);
                let suffix = match times {
                    0 => "",
                    1 => "Ki",
                    2 => "Mi",
                    3 => "Gi",
                    4 => "Ti",
                    5 => "Pi",
                    6 => "Ei",
                    _ => return None,
                };
                Some(format!("{amount}{suffix}"))
            }
            _ => {
                let (mut amount, times) = remove_factors(self.value, 10);
                let mut exponent = self.scale + times;
                match exponent % 3 {
                    1 | -2 => {
                        amount = amount.checked_mul(10)?;
                        exponent -= 1;
                    }
                    2 | -1 => {
                        amount = amount.checked_mul(100)?;
                        exponent -= 2;
                    }
                    _ => {}
                }
                let suffix = if format == QFormat::DecimalExponent {
                    if exponent == 0 {
                        String::new()
                    } else {
                        format!("e{exponent}")
                    }
                } else {
                    kcore::quantity::decimal_suffix(exponent)?.to_string()
                };
                Some(format!("{amount}{suffix}"))
            }
        }
    }

    /// -1024 < q < 1024, exactly.
    fn is_small(&self) -> bool {
        let v = i128::from(self.value);
        if self.scale >= 0 {
            let scaled = v.saturating_mul(10i128.saturating_pow(self.scale.unsigned_abs()));
            scaled > -1024 && scaled < 1024
        } else {
            let limit = 1024i128.saturating_mul(10i128.saturating_pow(self.scale.unsigned_abs()));
            v > -limit && v < limit
        }
    }
}

fn interpret_suffix(s: &str) -> Option<(i32, i32, QFormat)> {
    Some(match s {
        "" => (10, 0, QFormat::DecimalSI),
        "n" => (10, -9, QFormat::DecimalSI),
        "u" => (10, -6, QFormat::DecimalSI),
        "m" => (10, -3, QFormat::DecimalSI),
        "k" => (10, 3, QFormat::DecimalSI),
        "M" => (10, 6, QFormat::DecimalSI),
        "G" => (10, 9, QFormat::DecimalSI),
        "T" => (10, 12, QFormat::DecimalSI),
        "P" => (10, 15, QFormat::DecimalSI),
        "E" => (10, 18, QFormat::DecimalSI),
        "Ki" => (2, 10, QFormat::BinarySI),
        "Mi" => (2, 20, QFormat::BinarySI),
        "Gi" => (2, 30, QFormat::BinarySI),
        "Ti" => (2, 40, QFormat::BinarySI),
        "Pi" => (2, 50, QFormat::BinarySI),
        "Ei" => (2, 60, QFormat::BinarySI),
        _ if s.len() > 1 && (s.starts_with('e') || s.starts_with('E')) => {
            (10, s[1..].parse::<i64>().ok()? as i32, QFormat::DecimalExponent)
        }
        _ => return None,
    })
}

/// `value * 10^scale`, None on overflow.
fn positive_scale(value: i64, scale: i32) -> Option<i64> {
    let mut v = value;
    for _ in 0..scale {
        v = v.checked_mul(10)?;
    }
    Some(v)
}

/// `value / 10^scale` rounded away from zero, and whether it was exact (`negativeScaleInt64`).
fn negative_scale(value: i64, scale: i32) -> (i64, bool) {
    let mut v = value;
    let mut fraction = false;
    for _ in 0..scale {
        if !fraction && v % 10 != 0 {
            fraction = true;
        }
        v /= 10;
        if v == 0 {
            return if fraction {
                (if value > 0 { 1 } else { -1 }, false)
            } else {
                (0, true)
            };
        }
    }
    if fraction {
        v += if value > 0 { 1 } else { -1 };
    }
    (v, !fraction)
}

fn remove_factors(value: i64, base: i64) -> (i64, i32) {
    let negative = value < 0;
    let mut r = value.abs();
    let mut times = 0;
    while r >= base && r % base == 0 {
        times += 1;
        r /= base;
    }
    (if negative { -r } else { r }, times)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> (i64, i32, String, &'static str) {
        let q = Quantity::from_stored(s).expect("int64 quantity");
        (q.value, q.scale, q.cached, q.format.name())
    }

    #[test]
    fn quantities_as_the_controller_manager_decodes_them() {
        assert_eq!(q("100m"), (100, -3, "100m".into(), "DecimalSI"));
        assert_eq!(q("0.5"), (500, -3, "500m".into(), "DecimalSI"));
        assert_eq!(q("1000m"), (1, 0, "1".into(), "DecimalSI"));
        assert_eq!(q("1Gi"), (1 << 30, 0, "1Gi".into(), "BinarySI"));
        assert_eq!(q("128Mi"), (128 << 20, 0, String::new(), "BinarySI"));
        assert_eq!(q("100Mi"), (100 << 20, 0, "100Mi".into(), "BinarySI"));
        assert_eq!(q("0"), (0, 0, "0".into(), "DecimalSI"));
        assert_eq!(q("2"), (2, 0, "2".into(), "DecimalSI"));
    }

    #[test]
    fn safe_alphabet_of_a_decimal_sum() {
        // '0'..'9' are bytes 48..57, 48 % 27 = 21: '4'.
        assert_eq!(safe_encode("0123456789"), "456789bcdf");
    }

    #[test]
    fn spew_prints_types_pointers_and_nil() {
        let t = serde_json::json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx", "ports": [{"containerPort": 80}]}],
                     "terminationGracePeriodSeconds": 30}
        });
        let s = deep_print(&t);
        assert!(
            s.starts_with(
                "(v1.PodTemplateSpec){ObjectMeta:(v1.ObjectMeta){Name:(string) GenerateName:(string) "
            ),
            "{s}"
        );
        assert!(
            s.contains("Labels:(map[string]string)map[app:web] Annotations:(map[string]string)<nil>"),
            "{s}"
        );
        assert!(s.contains("CreationTimestamp:(v1.Time){Time:(time.Time){wall:(uint64)0 ext:(int64)0 loc:(*time.Location)<nil>}}"), "{s}");
        assert!(
            s.contains(
                "Containers:([]v1.Container)[{Name:(string)c Image:(string)nginx Command:([]string)<nil>"
            ),
            "{s}"
        );
        assert!(s.contains("Ports:([]v1.ContainerPort)[{Name:(string) HostPort:(int32)0 ContainerPort:(int32)80 Protocol:(v1.Protocol) HostIP:(string)}]"), "{s}");
        assert!(
            s.contains("TerminationGracePeriodSeconds:(*int64)30 ActiveDeadlineSeconds:(*int64)<nil>"),
            "{s}"
        );
    }

    /// Golden values printed once by upstream's ComputeHash (the real go-spew and apimachinery's
    /// Quantity over the same Go layout, built outside this repository): (template, hash, hash
    /// with collisionCount 1).
    const GOLDEN: &[(&str, &str, &str)] = &[
        (
            r#"{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"nginx:1"}],"restartPolicy":"Always"}}"#,
            "6dd87b7645",
            "75fdfd7548",
        ),
        (
            r#"{"metadata":{"creationTimestamp":null,"labels":{"app":"nginx"}},"spec":{"containers":[{"image":"nginx","imagePullPolicy":"Always","name":"nginx","resources":{},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File"}],"dnsPolicy":"ClusterFirst","restartPolicy":"Always","schedulerName":"default-scheduler","securityContext":{},"terminationGracePeriodSeconds":30}}"#,
            "5869d7778c",
            "5dbdb99998",
        ),
        (
            r#"{"metadata":{"labels":{"app":"api","tier":"be"},"annotations":{"checksum/config":"abc","kubectl.kubernetes.io/restartedAt":"2026-01-01T00:00:00Z"}},"spec":{"volumes":[{"name":"cache","emptyDir":{"sizeLimit":"1Gi"}},{"name":"cfg","configMap":{"name":"api","defaultMode":420,"items":[{"key":"a","path":"a.conf"}]}}],"containers":[{"name":"api","image":"registry.local/api:1.4.3","args":["--port","8080"],"ports":[{"name":"http","containerPort":8080,"protocol":"TCP"}],"env":[{"name":"A","value":"1"},{"name":"POD","valueFrom":{"fieldRef":{"apiVersion":"v1","fieldPath":"metadata.name"}}}],"resources":{"limits":{"cpu":"1000m","memory":"512Mi"},"requests":{"cpu":"0.5","memory":"128Mi","ephemeral-storage":"2"}},"readinessProbe":{"httpGet":{"path":"/ready","port":"http","scheme":"HTTP"},"periodSeconds":5,"failureThreshold":3},"livenessProbe":{"tcpSocket":{"port":8080},"initialDelaySeconds":10},"securityContext":{"runAsNonRoot":true,"capabilities":{"drop":["ALL"]},"allowPrivilegeEscalation":false},"volumeMounts":[{"name":"cfg","mountPath":"/etc/api","readOnly":true}]}],"nodeSelector":{"pool":"prod"},"tolerations":[{"key":"pool","operator":"Equal","value":"prod","effect":"NoSchedule"},{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],"affinity":{"podAntiAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":100,"podAffinityTerm":{"labelSelector":{"matchLabels":{"app":"api"}},"topologyKey":"kubernetes.io/hostname"}}]}},"terminationGracePeriodSeconds":45,"enableServiceLinks":false,"priority":0,"overhead":{"cpu":"100m","memory":"100Mi"}}}"#,
            "85f544f954",
            "5658cb764c",
        ),
    ];

    #[test]
    fn hashes_match_upstream_compute_hash() {
        for (template, hash, with_collision) in GOLDEN {
            let t: PodTemplateSpec = serde_json::from_str(template).expect("template");
            assert_eq!(compute_hash(&t, None), *hash, "{template}");
            assert_eq!(compute_hash(&t, Some(1)), *with_collision, "{template}");
        }
    }
}
