// Payments joined with an accounts table, in Go: the same processor as
// examples/fraud (Rust), with byte-identical alerts and dead letters. A
// payment over its account's limit, or on a blocked account, raises an
// alert (Kafka Streams' payments.join(accounts, joiner).filter(alert !=
// null)).
//
// The table `accounts` is the compacted topic of the same name,
// co-partitioned with the payments: the host keeps each task's partition of
// it in a read-only store, read here with the ordinary Get. A payment whose
// account is not in the table raises nothing (an inner join).
//
// Input: key = account, value = {"payment_id":"p1","account":"alice",
// "amount":250}. Table: key = account, value = {"limit":200,
// "status":"active"}. Output `alerts`: key = account, value =
// {"payment_id":"p1","account":"alice","amount":250,"limit":200,
// "reason":"over-limit"} (`reason` is `blocked` before `over-limit`). A
// malformed payment or account value is dead-lettered with the reason,
// serde_json's own words included (serde_json.go).
//
// Built by `onceflow build` with the onceflow Go SDK layer
// (wit_component/onceflow) and bindings from `wit-bindgen go`.
package main

import (
	"strconv"

	"wit_component/onceflow"
)

type fraud struct{}

func init() { onceflow.Register(fraud{}) }

func integer(fields jsonFields, field, what string) (int64, error) {
	if value, ok := fields[field]; ok && value.kind == jsonInteger {
		return value.integer, nil
	}
	return 0, onceflow.Errorf("%s: field \"%s\" must be an integer", what, field)
}

func text(fields jsonFields, field, what string) (string, error) {
	if value, ok := fields[field]; ok && value.kind == jsonString {
		return value.text, nil
	}
	return "", onceflow.Errorf("%s: field \"%s\" must be a string", what, field)
}

// appendJSONString appends text as serde_json writes a string
// (Value::from(text)): quote, backslash, \b \f \n \r \t, other control
// characters as \u00xx; everything else as is.
func appendJSONString(out []byte, text string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(text); i++ {
		switch c := text[i]; c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, '\\', 'b')
		case '\f':
			out = append(out, '\\', 'f')
		case '\n':
			out = append(out, '\\', 'n')
		case '\r':
			out = append(out, '\\', 'r')
		case '\t':
			out = append(out, '\\', 't')
		default:
			if c < 0x20 {
				out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			} else {
				out = append(out, c)
			}
		}
	}
	return append(out, '"')
}

func (fraud) Process(ctx *onceflow.Context, record *onceflow.Record) error {
	account, err := record.KeyStr()
	if err != nil {
		return err
	}
	if record.Value == nil {
		return onceflow.Errorf("record has no value")
	}
	payment, message, ok := parseJSON(record.Value)
	if !ok {
		return onceflow.Errorf("record value is not the expected JSON: %s", message)
	}
	paymentID, err := text(payment, "payment_id", "payment")
	if err != nil {
		return err
	}
	payer, err := text(payment, "account", "payment")
	if err != nil {
		return err
	}
	amount, err := integer(payment, "amount", "payment")
	if err != nil {
		return err
	}

	stored, found, err := ctx.Store("accounts").Get(record.Key)
	if err != nil || !found {
		return err
	}
	what := "account " + account
	settings, message, ok := parseJSON(stored)
	if !ok {
		return onceflow.Errorf("%s: its table value is not JSON: %s", what, message)
	}
	limit, err := integer(settings, "limit", what)
	if err != nil {
		return err
	}
	status, err := text(settings, "status", what)
	if err != nil {
		return err
	}
	var reason string
	switch {
	case status == "blocked":
		reason = "blocked"
	case amount > limit:
		reason = "over-limit"
	default:
		return nil
	}
	alert := []byte(`{"payment_id":`)
	alert = appendJSONString(alert, paymentID)
	alert = append(alert, `,"account":`...)
	alert = appendJSONString(alert, payer)
	alert = append(alert, `,"amount":`...)
	alert = strconv.AppendInt(alert, amount, 10)
	alert = append(alert, `,"limit":`...)
	alert = strconv.AppendInt(alert, limit, 10)
	alert = append(alert, `,"reason":"`+reason+`"}`...)
	return ctx.Emit("alerts", record.Key, alert)
}
