//! `strftime_now(format)`, the clock `transformers` gives chat templates (gpt-oss's and
//! Llama 3's write the current date into the system prompt), over UTC.

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Error, ErrorKind};

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

/// The current time written as `format` says (`%Y %m %d %H %M %S %y %b %B %a %A %j %%`).
pub fn strftime_now(format: String) -> Result<String, Error> {
    let seconds = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    strftime(&format, seconds)
}

/// `seconds` since the epoch written as `format` says.
fn strftime(format: &str, seconds: u64) -> Result<String, Error> {
    let days = i64::try_from(seconds / 86_400).unwrap_or(0);
    let (year, month, day) = civil_from_days(days);
    let second_of_day = seconds % 86_400;
    let weekday = usize::try_from((days + 3).rem_euclid(7)).unwrap_or(0);
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let month_name = MONTHS[(month - 1) as usize];
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('H') => out.push_str(&format!("{:02}", second_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", second_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", second_of_day % 60)),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now does not support %{}", other.unwrap_or(' ')),
                ))
            }
        }
    }
    Ok(out)
}

/// The (year, month, day) of the proleptic Gregorian calendar `days` after 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days from 1970-01-01 to the given date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_index = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_times_are_written_as_python_writes_them() {
        // 2024-02-29 13:05:09 UTC, a Thursday, the 60th day of the year.
        let leap_day = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d", leap_day).unwrap(), "2024-02-29");
        assert_eq!(strftime("%d %b %Y", leap_day).unwrap(), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %j %H:%M:%S %y %a %%", leap_day).unwrap(),
            "Thursday February 060 13:05:09 24 Thu %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert!(strftime("%Q", 0).is_err());
    }
}
