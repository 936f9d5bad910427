//! `strftime_now(format)`: the current UTC time formatted with C `strftime` specifiers.
//!
//! Hugging Face exposes this global to chat templates (Llama 3.x puts "Today Date:
//! 26 Jul 2024" in its system prompt). Only the specifiers such templates use are
//! supported; any other `%x` is written out unchanged, so an unexpected format never
//! fails a request.

use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A UTC calendar time broken into fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CivilTime {
    pub(crate) year: i64,
    /// 1..=12
    pub(crate) month: u32,
    /// 1..=31
    pub(crate) day: u32,
    pub(crate) hour: u32,
    pub(crate) minute: u32,
    pub(crate) second: u32,
    /// 0 = Monday .. 6 = Sunday
    pub(crate) weekday: u32,
    /// 1..=366
    pub(crate) day_of_year: u32,
}

impl CivilTime {
    /// Breaks seconds since the Unix epoch into UTC fields (proleptic Gregorian calendar).
    pub(crate) fn from_unix_seconds(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        // Days-to-civil conversion on 400-year eras (Howard Hinnant's published method).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy_march = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy_march + 2) / 153;
        let day = (doy_march - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let day_of_year = CUMULATIVE[(month - 1) as usize] + day + u32::from(leap && month > 2);
        // 1970-01-01 was a Thursday (index 3 with Monday = 0).
        let weekday = (days + 3).rem_euclid(7) as u32;
        CivilTime {
            year,
            month,
            day,
            hour: (rem / 3600) as u32,
            minute: (rem % 3600 / 60) as u32,
            second: (rem % 60) as u32,
            weekday,
            day_of_year,
        }
    }

    /// Formats with C `strftime` specifiers (see the module docs for the supported set).
    pub(crate) fn format(&self, fmt: &str) -> String {
        let mut out = String::with_capacity(fmt.len() + 16);
        let mut chars = fmt.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let Some(spec) = chars.next() else {
                out.push('%');
                break;
            };
            let month_name = MONTHS[(self.month - 1) as usize];
            let weekday_name = WEEKDAYS[self.weekday as usize];
            match spec {
                'Y' => out.push_str(&self.year.to_string()),
                'y' => out.push_str(&format!("{:02}", self.year.rem_euclid(100))),
                'm' => out.push_str(&format!("{:02}", self.month)),
                'd' => out.push_str(&format!("{:02}", self.day)),
                'e' => out.push_str(&format!("{:>2}", self.day)),
                'j' => out.push_str(&format!("{:03}", self.day_of_year)),
                'H' => out.push_str(&format!("{:02}", self.hour)),
                'I' => out.push_str(&format!("{:02}", (self.hour + 11) % 12 + 1)),
                'M' => out.push_str(&format!("{:02}", self.minute)),
                'S' => out.push_str(&format!("{:02}", self.second)),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'B' => out.push_str(month_name),
                'b' | 'h' => out.push_str(&month_name[..3]),
                'A' => out.push_str(weekday_name),
                'a' => out.push_str(&weekday_name[..3]),
                'F' => out.push_str(&format!("{}-{:02}-{:02}", self.year, self.month, self.day)),
                'T' => out.push_str(&format!(
                    "{:02}:{:02}:{:02}",
                    self.hour, self.minute, self.second
                )),
                '%' => out.push('%'),
                other => {
                    out.push('%');
                    out.push(other);
                }
            }
        }
        out
    }
}

/// The template global: formats the current UTC time.
pub(crate) fn strftime_now(fmt: &str) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    CivilTime::from_unix_seconds(secs).format(fmt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        let t = CivilTime::from_unix_seconds(1_721_999_109);
        assert_eq!(t.format("%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            t.format("%A %B %e %j %H:%M:%S %I%p %y %%"),
            "Friday July 26 208 13:05:09 01PM 24 %"
        );
        let epoch = CivilTime::from_unix_seconds(0);
        assert_eq!(epoch.format("%F %T %a"), "1970-01-01 00:00:00 Thu");
        // Leap day and the end of a leap year.
        assert_eq!(
            CivilTime::from_unix_seconds(951_782_400).format("%F %j"),
            "2000-02-29 060"
        );
        assert_eq!(
            CivilTime::from_unix_seconds(1_735_603_200).format("%F %j"),
            "2024-12-31 366"
        );
        assert_eq!(CivilTime::from_unix_seconds(0).format("%Q"), "%Q");
    }
}
