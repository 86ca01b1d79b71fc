// Payments joined with an accounts table, in JavaScript: the same processor
// as examples/fraud (Rust), with byte-identical alerts and dead letters. A
// payment over its account's limit, or on a blocked account, raises an
// alert (Kafka Streams' payments.join(accounts, joiner).filter(alert !=
// null)).
//
// The table `accounts` is the compacted topic of the same name,
// co-partitioned with the payments: the host keeps each task's partition of
// it in a read-only store, read here with the ordinary `get`. A payment
// whose account is not in the table raises nothing (an inner join).
//
// Input: key = account, value = {"payment_id":"p1","account":"alice",
// "amount":250}. Table: key = account, value = {"limit":200,
// "status":"active"}. Output `alerts`: key = account, value =
// {"payment_id":"p1","account":"alice","amount":250,"limit":200,
// "reason":"over-limit"} (`reason` is `blocked` before `over-limit`). A
// malformed payment or account value is dead-lettered with the reason,
// serde_json's own words included (./serde_json.js).
//
// Built by `onceflow build` (ComponentizeJS) with the onceflow SDK layer
// ./onceflow.js (guest-sdk/js).

import { exportProcessor, keyStr, RecordError } from './onceflow.js';
import { parse } from './serde_json.js';

function integer(fields, field, what) {
  const value = fields.get(field);
  if (value === undefined || value.kind !== 'int') {
    throw new RecordError(`${what}: field "${field}" must be an integer`);
  }
  return value.value;
}

function text(fields, field, what) {
  const value = fields.get(field);
  if (value === undefined || value.kind !== 'str') {
    throw new RecordError(`${what}: field "${field}" must be a string`);
  }
  return value.value;
}

export const { init, process, punctuate } = exportProcessor((ctx, record) => {
  const account = keyStr(record);
  if (record.value === undefined) throw new RecordError('record has no value');
  const payment = parse(record.value);
  if (payment.error !== undefined) {
    throw new RecordError(`record value is not the expected JSON: ${payment.error}`);
  }
  const paymentId = text(payment.fields, 'payment_id', 'payment');
  const payer = text(payment.fields, 'account', 'payment');
  const amount = integer(payment.fields, 'amount', 'payment');

  const stored = ctx.store('accounts').get(record.key);
  if (stored === undefined) return;
  const what = `account ${account}`;
  const settings = parse(stored);
  if (settings.error !== undefined) {
    throw new RecordError(`${what}: its table value is not JSON: ${settings.error}`);
  }
  const limit = integer(settings.fields, 'limit', what);
  let reason;
  if (text(settings.fields, 'status', what) === 'blocked') reason = 'blocked';
  else if (amount > limit) reason = 'over-limit';
  else return;
  // JSON.stringify escapes a (well-formed) string as serde_json does.
  const alert =
    `{"payment_id":${JSON.stringify(paymentId)},"account":${JSON.stringify(payer)},` +
    `"amount":${amount},"limit":${limit},"reason":"${reason}"}`;
  ctx.emit('alerts', record.key, alert);
});
