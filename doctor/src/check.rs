//! One finding: a name, ok / warn / fail, the value seen and the fix. Printed one line per
//! check, or as JSON objects `{name, status, value, hint}`.

use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub value: String,
    /// What to do about it; empty when there is nothing to do.
    pub hint: String,
}

impl Check {
    pub fn ok(name: impl Into<String>, value: impl Into<String>) -> Check {
        Check::new(name, Status::Ok, value, "")
    }

    pub fn warn(name: impl Into<String>, value: impl Into<String>, hint: impl Into<String>) -> Check {
        Check::new(name, Status::Warn, value, hint)
    }

    pub fn fail(name: impl Into<String>, value: impl Into<String>, hint: impl Into<String>) -> Check {
        Check::new(name, Status::Fail, value, hint)
    }

    pub fn new(name: impl Into<String>, status: Status, value: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status,
            value: value.into(),
            hint: hint.into(),
        }
    }

    /// `warn  memlock                    64 KiB ... — fix: ...`
    pub fn line(&self) -> String {
        let mut text = format!("{:<4}  {:<30} {}", self.status.as_str(), self.name, self.value);
        if !self.hint.is_empty() {
            text.push_str(" — fix: ");
            text.push_str(&self.hint);
        }
        text
    }

    pub fn to_json(&self) -> Value {
        json!({"name": self.name, "status": self.status.as_str(), "value": self.value, "hint": self.hint})
    }
}

/// Prints checks as they are found: text lines, or the elements of one JSON array.
pub struct Printer {
    json: bool,
    printed: usize,
    worst: Status,
}

impl Printer {
    pub fn new(json: bool) -> Printer {
        if json {
            println!("[");
        }
        Printer {
            json,
            printed: 0,
            worst: Status::Ok,
        }
    }

    pub fn print(&mut self, check: &Check) {
        if self.json {
            let sep = if self.printed == 0 { "" } else { "," };
            println!("{sep}{}", check.to_json());
        } else {
            println!("{}", check.line());
        }
        self.printed += 1;
        self.worst = self.worst.max(check.status);
    }

    pub fn print_all(&mut self, checks: &[Check]) {
        for c in checks {
            self.print(c);
        }
    }

    /// A line for a person, never inside the JSON (stderr then).
    pub fn note(&self, text: &str) {
        if self.json {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
    }

    /// Ends the output; the exit status is 1 when any check failed.
    pub fn finish(self) -> i32 {
        if self.json {
            println!("]");
        }
        i32::from(self.worst == Status::Fail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_status_name_value_and_fix() {
        let c = Check::warn("memlock", "64 KiB", "ulimit -l unlimited");
        assert_eq!(
            c.line(),
            "warn  memlock                        64 KiB — fix: ulimit -l unlimited"
        );
        assert_eq!(
            Check::ok("devices", "1").line(),
            "ok    devices                        1"
        );
    }

    #[test]
    fn json_has_the_four_fields() {
        let c = Check::fail("NCCL_IB_HCA", "=mlx5_9 matches no port", "unset it");
        assert_eq!(
            c.to_json(),
            json!({"name": "NCCL_IB_HCA", "status": "fail", "value": "=mlx5_9 matches no port", "hint": "unset it"})
        );
    }
}
