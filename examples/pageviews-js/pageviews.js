// Page views, in JavaScript: the same processor as examples/pageviews
// (Rust), with byte-identical outputs and dead letters. It counts views per
// page in tumbling one-minute windows with a ten-second grace and emits each
// window's count once, when stream time passes its end plus the grace
// (Kafka Streams' suppress(untilWindowCloses)).
//
// Input: key = the page, the record's timestamp = when it was viewed; the
// value is not read. Output `counts`: key = the page, value =
// {"page":"/home","start":1700000040000,"end":1700000100000,"count":3}. A
// view whose window had closed is reported late; the manifest dead-letters
// it.
//
// Built by `onceflow build` (ComponentizeJS) with the onceflow SDK layer
// ./onceflow.js (guest-sdk/js).

import {
  decodeUtf8,
  exportProcessor,
  keyStr,
  RecordError,
  schedulePunctuation,
  TimeWindows,
} from './onceflow.js';

const WINDOWS = TimeWindows.tumbling(60_000, 10_000);
const STORE = 'views';

function decode(bytes, what) {
  const text = decodeUtf8(bytes);
  if (text === undefined) throw new RecordError(`a stored ${what} is not UTF-8`);
  return text;
}

/** `text` as a JSON string: quotes, backslashes and control characters escaped. */
function jsonString(text) {
  return `"${text.replace(/["\\\u0000-\u001f]/g, (c) =>
    c === '"' || c === '\\' ? `\\${c}` : `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
  )}"`;
}

export const { init, process, punctuate } = exportProcessor({
  init() {
    // Every 10 s of stream time: each point where a window closes.
    schedulePunctuation(WINDOWS.punctuationInterval());
  },

  process(ctx, record) {
    const page = keyStr(record);
    const views = ctx.windowStore(STORE);
    const now = ctx.streamTime();
    const open = WINDOWS.openWindows(record.timestamp, now);
    if (open.length === 0) {
      ctx.reportLate(
        `view of ${page} at ${record.timestamp} arrived after its window closed ` +
          `(stream time ${now ?? record.timestamp})`,
      );
      return;
    }
    for (const start of open) {
      views.putI64(record.key, start, (views.getI64(record.key, start) ?? 0n) + 1n);
    }
  },

  punctuate(ctx, streamTime) {
    const views = ctx.windowStore(STORE);
    WINDOWS.takeClosed(views, streamTime, (window) => {
      const page = decode(window.key, 'page');
      const count = decode(window.value, 'count');
      const value =
        `{"page":${jsonString(page)},"start":${window.start},` +
        `"end":${WINDOWS.end(window.start)},"count":${count}}`;
      ctx.emit('counts', window.key, value);
    });
  },
});
