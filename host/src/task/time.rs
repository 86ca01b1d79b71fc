//! A task's clocks: stream time, the last sweep of expired windows, and
//! where stream-time punctuation falls.

/// What a commit fixes and an abort goes back to.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Times {
    /// The largest record timestamp seen.
    pub(super) stream: Option<i64>,
    /// The stream time of the last sweep of expired windows.
    pub(super) swept: Option<i64>,
}

/// The first stream-time punctuation point after `before`: the next
/// multiple of `every` (Kafka Streams aligns stream-time schedules to 0 and
/// skips the points a jump in time passed over).
pub(super) fn next_punctuation(before: i64, every: u64) -> i64 {
    let every = every.min(i64::MAX as u64) as i64;
    before
        .div_euclid(every)
        .saturating_add(1)
        .saturating_mul(every)
}
