//! PostgreSQL's error text, with the values taken out.
//!
//! A record that does not fit its table becomes a dead letter whose reason
//! is the server's message, and the sink's warnings reach the tenant
//! (`onceflow describe`). PostgreSQL quotes values into its messages
//! (`invalid input syntax for type integer: "acct-1=250"`, `Key
//! (account)=(acct-1) already exists`), so a statement that casts rows into
//! an error would carry them out. What is kept: the SQLSTATE, the generic
//! message, and the names the server reports in its own fields (schema,
//! table, column, data type, constraint). Every other quoted text, and the
//! values after `=(` or `contains (` in the detail, become `…`.

/// What replaces a value.
pub const PLACEHOLDER: &str = "…";

/// The server's message and detail, redacted, with the SQLSTATE; a
/// client-side error (connection, protocol, conversion) as is: it holds no
/// value of the database's.
pub(crate) fn pg_message(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => {
            let names: Vec<&str> = [
                d.schema(),
                d.table(),
                d.column(),
                d.datatype(),
                d.constraint(),
            ]
            .into_iter()
            .flatten()
            .collect();
            let mut text = format!(
                "{} (SQLSTATE {})",
                redact(d.message(), &names),
                d.code().code()
            );
            if let Some(detail) = d.detail() {
                text.push_str(&format!(": {}", redact_detail(detail, &names)));
            }
            text
        }
        None => e.to_string(),
    }
}

/// `text` with each quoted segment (`"..."` or `'...'`) that is not one of
/// `names` replaced by the placeholder. From the first such segment to
/// the last quote closing one, everything goes: a value holding a quote
/// cannot split its way out.
pub fn redact(text: &str, names: &[&str]) -> String {
    // The quotes' byte positions, paired in order.
    let quotes: Vec<(usize, char)> = text
        .char_indices()
        .filter(|(_, c)| *c == '"' || *c == '\'')
        .collect();
    let mut first: Option<usize> = None;
    let mut last: Option<usize> = None;
    let mut i = 0;
    while i < quotes.len() {
        let (open, q) = quotes[i];
        // Its closing quote: the next of the same kind.
        let close = quotes[i + 1..].iter().position(|(_, c)| *c == q);
        match close {
            Some(k) => {
                let (end, _) = quotes[i + 1 + k];
                let inner = &text[open + 1..end];
                if !names.contains(&inner) {
                    first.get_or_insert(open);
                    last = Some(end);
                }
                i += k + 2;
            }
            None => {
                // An unpaired quote: the rest is a value.
                first.get_or_insert(open);
                last = Some(text.len() - 1);
                break;
            }
        }
    }
    match (first, last) {
        (Some(a), Some(b)) if b >= a => {
            let end = b + text[b..].chars().next().map_or(1, char::len_utf8);
            format!("{}\"{PLACEHOLDER}\"{}", &text[..a], &text[end..])
        }
        _ => text.to_owned(),
    }
}

/// A detail (`Key (account)=(acct-1) already exists.`, `Failing row
/// contains (1, x).`): the values in parentheses after `=` or `contains `
/// (to the last closing parenthesis) go, then quoted values as in
/// [`redact`].
pub fn redact_detail(detail: &str, names: &[&str]) -> String {
    let start = [detail.find("=("), detail.find("contains (")]
        .into_iter()
        .flatten()
        .min();
    let text = match (start, detail.rfind(')')) {
        (Some(a), Some(b)) if b > a => {
            let open = a + detail[a..].find('(').unwrap_or(0);
            format!("{}({PLACEHOLDER}){}", &detail[..open], &detail[b + 1..])
        }
        _ => detail.to_owned(),
    };
    redact(&text, names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_go_names_stay() {
        assert_eq!(
            redact(
                "invalid input syntax for type integer: \"LEAKacct-1=250,acct-2=900\"",
                &[]
            ),
            "invalid input syntax for type integer: \"…\""
        );
        assert_eq!(
            redact(
                "null value in column \"balance\" of relation \"balances\" violates not-null constraint",
                &["balance", "balances", "acme"]
            ),
            "null value in column \"balance\" of relation \"balances\" violates not-null constraint"
        );
        assert_eq!(
            redact(
                "duplicate key value violates unique constraint \"balances_pkey\"",
                &["balances_pkey"]
            ),
            "duplicate key value violates unique constraint \"balances_pkey\""
        );
        // A value that holds quotes cannot split its way out.
        let e = redact(
            "invalid input syntax for type integer: \"a\" b \"secret\"",
            &["b"],
        );
        assert!(!e.contains("secret") && !e.contains(" b "), "{e}");
        let e = redact("value 'x' and an unpaired \" secret", &[]);
        assert!(!e.contains("secret") && !e.contains('x'), "{e}");
    }

    #[test]
    fn details_lose_their_values() {
        assert_eq!(
            redact_detail("Key (account)=(acct-1) already exists.", &[]),
            "Key (account)=(…) already exists."
        );
        assert_eq!(
            redact_detail("Failing row contains (acct-1, secret (x)).", &[]),
            "Failing row contains (…)."
        );
        assert_eq!(
            redact_detail(
                "Key (a)=(x) is not present in table \"accounts\".",
                &["accounts"]
            ),
            "Key (a)=(…) is not present in table \"accounts\"."
        );
        assert_eq!(
            redact_detail("Token \"LEAK\" is invalid.", &[]),
            "Token \"…\" is invalid."
        );
    }
}
