// Wallet, in Go: the same processor as examples/wallet (Rust), with
// byte-identical outputs and error messages. It keeps a balance per account
// in the state store `balances` and, for every payment, emits the new
// balance (alias `balances`) and an audit copy of the payment (alias
// `audit`).
//
// Input values are JSON objects {"payment_id": str, "account": str,
// "amount": int}, read by payment_json.go exactly as serde_json reads them;
// the fields are then checked in the same order with the same messages.
//
// Built by `onceflow build` with the onceflow Go SDK layer
// (wit_component/onceflow) and bindings from `wit-bindgen go`.
package main

import (
	"math"
	"strconv"
	"strings"

	"wit_component/onceflow"
)

type wallet struct{}

func init() { onceflow.Register(wallet{}) }

func invalid(reason string) error {
	return onceflow.Errorf("invalid payment: %s", reason)
}

func missing(name string) error {
	return invalid("missing field \"" + name + "\"")
}

func (wallet) Process(ctx *onceflow.Context, record *onceflow.Record) error {
	paymentID, account, amount, err := parse(record.Value)
	if err != nil {
		return err
	}
	balances := ctx.Store("balances")
	accountKey := []byte(account)
	balance, _, err := balances.GetI64(accountKey)
	if err != nil {
		return err
	}
	if (amount > 0 && balance > math.MaxInt64-amount) || (amount < 0 && balance < math.MinInt64-amount) {
		return invalid("balance overflow for account \"" + account + "\"")
	}
	balance += amount

	// Every check has passed: only now change anything.
	if err := balances.PutI64(accountKey, balance); err != nil {
		return err
	}
	report := `{"account":` + jsonString(account) + `,"balance":` + strconv.FormatInt(balance, 10) +
		`,"payment_id":` + jsonString(paymentID) + `}`
	if err := ctx.Emit("balances", accountKey, []byte(report)); err != nil {
		return err
	}
	raw := record.Value
	if raw == nil {
		raw = []byte{}
	}
	return ctx.Emit("audit", []byte(paymentID), raw)
}

// parse checks a payment, in a fixed order, with fixed messages.
func parse(value []byte) (paymentID, account string, amount int64, err error) {
	if value == nil {
		return "", "", 0, invalid("missing value")
	}
	fields, result := parsePayment(value)
	switch result {
	case parsedNotJSON:
		return "", "", 0, invalid("not valid JSON")
	case parsedNotObject:
		return "", "", 0, invalid("not a JSON object")
	}
	if paymentID, err = stringField(fields.paymentID, "payment_id"); err != nil {
		return
	}
	if account, err = stringField(fields.account, "account"); err != nil {
		return
	}
	switch fields.amount.kind {
	case fieldAbsent:
		err = missing("amount")
	case fieldInteger:
		amount = fields.amount.integer
	default:
		err = invalid("field \"amount\" must be an integer")
	}
	return
}

func stringField(field paymentField, name string) (string, error) {
	switch field.kind {
	case fieldAbsent:
		return "", missing(name)
	case fieldString:
		return field.text, nil
	default:
		return "", invalid("field \"" + name + "\" must be a string")
	}
}

// jsonString is text as a JSON string literal, escaped as serde_json does:
// quote, backslash and control characters only (\b \f \n \r \t, else
// \u00XX in lowercase hex).
func jsonString(text string) string {
	const hex = "0123456789abcdef"
	var out strings.Builder
	out.WriteByte('"')
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c == '"':
			out.WriteString(`\"`)
		case c == '\\':
			out.WriteString(`\\`)
		case c == '\b':
			out.WriteString(`\b`)
		case c == '\f':
			out.WriteString(`\f`)
		case c == '\n':
			out.WriteString(`\n`)
		case c == '\r':
			out.WriteString(`\r`)
		case c == '\t':
			out.WriteString(`\t`)
		case c < 0x20:
			out.WriteString(`\u00`)
			out.WriteByte(hex[c>>4])
			out.WriteByte(hex[c&0xf])
		default:
			out.WriteByte(c)
		}
	}
	out.WriteByte('"')
	return out.String()
}
