// Test guest, in JavaScript: the same processor as tests/guests/sessions
// (Rust). Clicks counted per user and session with the SDK's
// SessionWindows (a session ends after 5 s without a click; 10 s of
// grace), each session emitted once when it closes, late clicks reported.
// Output `sessions`: key = user, value = "<start> <end> <count>".

import { decodeUtf8, exportProcessor, keyStr, schedulePunctuation, SessionWindows } from './onceflow.js';

const SESSIONS = SessionWindows.withGap(5_000, 10_000);
const STORE = 'sessions';

/** A count stored as decimal text (0 if it is not one). */
function count(bytes) {
  const text = decodeUtf8(bytes);
  return text !== undefined && /^\+?[0-9]+$/.test(text) ? BigInt(text) : 0n;
}

export const { init, process, punctuate } = exportProcessor({
  init() {
    // At every advance of stream time: each session is emitted at the
    // record that closes it.
    schedulePunctuation(1);
  },

  process(ctx, record) {
    const user = keyStr(record);
    const session = SESSIONS.record(
      ctx.windowStore(STORE),
      record.key,
      record.timestamp,
      ctx.streamTime(),
      (a, b) => (count(a) + count(b)).toString(),
      (old) => ((old === undefined ? 0n : count(old)) + 1n).toString(),
    );
    if (session === undefined) {
      ctx.reportLate(`click of ${user} at ${record.timestamp} after its session closed`);
    }
  },

  punctuate(ctx, streamTime) {
    SESSIONS.takeClosed(ctx.windowStore(STORE), streamTime, (s) => {
      ctx.emit('sessions', s.key, `${s.start} ${s.end} ${count(s.value)}`);
    });
  },
});
