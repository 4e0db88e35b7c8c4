//! What a declared variable is: its type, accepted values and default (for the docs and the
//! doctor), how its text becomes a value and how a value prints back as a user would set it.
//! The declaration table (`table.rs`) builds one `Kind` per variable with the functions here;
//! `Reader` applies them to the environment and collects one warning per bad value.

use super::list::parse_c_integer;
use std::fmt::Display;

/// The outcome of parsing one value: the value to use (`None`: the default) and the problem to
/// warn about, if any. A lenient parser returns both (it kept what was valid).
pub(super) struct Parsed<T> {
    pub value: Option<T>,
    pub problem: Option<String>,
}

/// One variable's type, range and default, with its parser and printer.
pub(super) struct Kind<T> {
    /// The type as the docs name it ("integer", "flag", "device list", ...).
    pub ty: &'static str,
    /// The accepted values, as the docs state them.
    pub accepts: String,
    pub default: T,
    /// The default as a user would write it, with what it stands for (`-1 (auto)`).
    pub doc_default: String,
    /// NCCL's own default, where ferroce's differs.
    pub nccl_default: Option<&'static str>,
    /// Shown on the INFO `config:` line even when unset: it decides devices, GIDs or QPs.
    pub decides: bool,
    parse: ParseFn<T>,
    show: ShowFn<T>,
}

type ParseFn<T> = Box<dyn Fn(&str) -> Parsed<T>>;
type ShowFn<T> = Box<dyn Fn(&T) -> String>;

impl<T: 'static> Kind<T> {
    /// The value written back as a user would set it (`(auto)` etc. for automatic choices).
    pub(super) fn show(&self, value: &T) -> String {
        (self.show)(value)
    }

    pub(super) fn parse(&self, text: &str) -> Parsed<T> {
        (self.parse)(text)
    }

    /// Marks the variable as one the INFO line always shows.
    pub(super) fn decides(mut self) -> Self {
        self.decides = true;
        self
    }

    /// Records NCCL's default where ferroce's differs (the docs show both).
    pub(super) fn nccl_default(mut self, text: &'static str) -> Self {
        self.nccl_default = Some(text);
        self
    }
}

impl<T: PartialEq + Display + 'static> Kind<T> {
    /// `value` prints as `text` (`-1` as `(auto)`): it stands for an automatic choice.
    pub(super) fn special(mut self, value: T, text: &'static str) -> Self {
        if self.default == value {
            self.doc_default = format!("{value} {text}");
        }
        let inner = self.show;
        self.show = Box::new(move |v: &T| if *v == value { text.to_string() } else { inner(v) });
        self
    }

    /// Values print with a unit after them (`100 ms`).
    pub(super) fn unit(mut self, unit: &'static str) -> Self {
        let inner = self.show;
        self.show = Box::new(move |v: &T| format!("{} {unit}", inner(v)));
        self.ty = match self.ty {
            "integer" => "integer (ms)",
            other => other,
        };
        self
    }
}

/// An integer in `min..=max` as C's `strtoll(.., 0)` reads it (decimal, `0x` hex, `0` octal).
/// `min..=max` must lie within `T`.
pub(super) fn int<T>(default: T, min: i64, max: i64) -> Kind<T>
where
    T: TryFrom<i64> + Display + 'static,
{
    let accepts = if max == i64::MAX {
        format!("{min} or more")
    } else {
        format!("{min}..={max}")
    };
    Kind {
        ty: "integer",
        accepts,
        doc_default: default.to_string(),
        default,
        nccl_default: None,
        decides: false,
        parse: Box::new(move |text: &str| match parse_c_integer(text) {
            Some(v) if (min..=max).contains(&v) => Parsed {
                value: T::try_from(v).ok(),
                problem: None,
            },
            Some(_) => problem(format!("out of range {min}..={max}")),
            None => problem(format!("expected an integer in {min}..={max}")),
        }),
        show: Box::new(|v: &T| v.to_string()),
    }
}

/// A switch: 0 is off, any other integer on (as NCCL reads its flags).
pub(super) fn flag(default: bool) -> Kind<bool> {
    Kind {
        ty: "flag",
        accepts: "0 or 1".into(),
        default,
        doc_default: show_flag(&default),
        nccl_default: None,
        decides: false,
        parse: Box::new(|text: &str| match parse_c_integer(text) {
            Some(v) => Parsed {
                value: Some(v != 0),
                problem: None,
            },
            None => problem("expected 0 or 1".into()),
        }),
        show: Box::new(show_flag),
    }
}

fn show_flag(v: &bool) -> String {
    if *v { "1" } else { "0" }.to_string()
}

/// Free text (a path, a directory); unset prints as `unset`.
pub(super) fn text(ty: &'static str, unset: &'static str) -> Kind<Option<String>> {
    Kind {
        ty,
        accepts: format!("any {ty}"),
        default: None,
        doc_default: unset.into(),
        nccl_default: None,
        decides: false,
        parse: Box::new(|text: &str| Parsed {
            value: Some(Some(text.to_string())),
            problem: None,
        }),
        show: Box::new(move |v: &Option<String>| v.clone().unwrap_or_else(|| unset.into())),
    }
}

/// A structured value with its own parser: an error names what was expected, and the default
/// is used.
pub(super) fn strict<T: 'static>(
    ty: &'static str,
    accepts: &str,
    default: T,
    parse: fn(&str) -> Result<T, String>,
    show: fn(&T) -> String,
) -> Kind<T> {
    Kind {
        ty,
        accepts: accepts.into(),
        doc_default: show(&default),
        default,
        nccl_default: None,
        decides: false,
        parse: Box::new(move |text: &str| match parse(text) {
            Ok(v) => Parsed {
                value: Some(v),
                problem: None,
            },
            Err(e) => problem(e),
        }),
        show: Box::new(show),
    }
}

/// A structured value whose parser keeps what is valid and reports the first problem (the
/// device lists, as NCCL reads them).
pub(super) fn lenient<T: 'static>(
    ty: &'static str,
    accepts: &str,
    default: T,
    parse: fn(&str) -> (T, Option<String>),
    show: fn(&T) -> String,
) -> Kind<T> {
    Kind {
        ty,
        accepts: accepts.into(),
        doc_default: show(&default),
        default,
        nccl_default: None,
        decides: false,
        parse: Box::new(move |text: &str| {
            let (value, problem) = parse(text);
            Parsed {
                value: Some(value),
                problem,
            }
        }),
        show: Box::new(show),
    }
}

fn problem<T>(reason: String) -> Parsed<T> {
    Parsed {
        value: None,
        problem: Some(reason),
    }
}

/// A 64-bit value in any C integer notation; negative values wrap, as NCCL's `strtoull` cast.
pub(super) fn parse_u64_bits(text: &str) -> Result<u64, String> {
    parse_c_integer(text)
        .map(|v| v as u64)
        .ok_or_else(|| "expected an integer".into())
}

pub(super) fn show_hex(v: &u64) -> String {
    format!("{v:#x}")
}

/// A problem found while reading the environment: it becomes one WARN line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    pub variable: &'static str,
    pub value: String,
    pub reason: String,
}

impl Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ignoring {}={:?}: {}; using the default",
            self.variable, self.value, self.reason
        )
    }
}

/// Reads variables through a lookup function, collecting one warning per bad value.
pub(super) struct Reader<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    pub warnings: Vec<ConfigWarning>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Reader {
            lookup,
            warnings: Vec::new(),
        }
    }

    /// The value of `name`; unset and blank are the same.
    pub(super) fn raw(&self, name: &str) -> Option<String> {
        (self.lookup)(name).filter(|v| !v.trim().is_empty())
    }

    /// The value of `name` as `kind` parses it; the default when unset or when it does not
    /// parse, with a warning for the latter.
    pub(super) fn read<T: 'static>(&mut self, name: &'static str, kind: Kind<T>) -> T {
        let Some(text) = self.raw(name) else {
            return kind.default;
        };
        let parsed = kind.parse(&text);
        if let Some(reason) = parsed.problem {
            self.warn(name, &text, reason);
        }
        parsed.value.unwrap_or(kind.default)
    }

    pub(super) fn warn(&mut self, variable: &'static str, value: &str, reason: impl Into<String>) {
        self.warnings.push(ConfigWarning {
            variable,
            value: value.to_string(),
            reason: reason.into(),
        });
    }
}

/// One variable and its resolved value, written as a user would set it (`(all)`, `(auto)`,
/// `(default)` stand for "unset, NCCL's automatic choice").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    pub value: String,
    /// Shown at INFO even when unset: it decides devices, GIDs or QPs.
    pub decides: bool,
}
