package main

// JSON as serde_json reads it, so that the Go wallet rejects exactly the
// records the Rust wallet rejects. encoding/json is more lenient (invalid
// UTF-8 and lone surrogates become U+FFFD, nesting up to 10000 levels,
// numbers that overflow f64 are left to the caller) and cannot tell the
// last of duplicate keys from the first for a struct, so this reader
// follows serde_json's grammar instead:
//   - UTF-8 only (a BOM is an error); whitespace is space, \t, \n, \r;
//   - strings: no raw control characters, the usual escapes, \u escapes
//     whose surrogates must pair up;
//   - numbers: JSON's grammar (no leading zeros); a number whose value
//     overflows f64 is an error: serde_json's digit loop and
//     f64_from_parts are replayed;
//   - at most 127 levels of nesting (serde_json refuses the 128th);
//   - duplicate keys: the last one wins.
// An integer is what Value::as_i64 accepts: no fraction or exponent, within
// i64, and not -0 (a float for serde_json).

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

const maxDepth = 127

type fieldKind int

const (
	fieldAbsent fieldKind = iota
	fieldString
	fieldInteger
	fieldOther
)

type paymentField struct {
	kind    fieldKind
	text    string
	integer int64
}

type paymentFields struct {
	paymentID, account, amount paymentField
}

type parseResult int

const (
	parsedObject parseResult = iota
	parsedNotJSON
	parsedNotObject
)

type jsonReader struct {
	s     []byte
	i     int
	depth int
}

type badJSON struct{}

func (r *jsonReader) fail() { panic(badJSON{}) }

func (r *jsonReader) peek() int {
	if r.i < len(r.s) {
		return int(r.s[r.i])
	}
	return -1
}

func (r *jsonReader) skipWhitespace() {
	for r.i < len(r.s) {
		switch r.s[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// parsePayment reads a whole JSON text and, for an object, the last values
// of its payment fields.
func parsePayment(text []byte) (fields paymentFields, result parseResult) {
	defer func() {
		if recovered := recover(); recovered != nil {
			if _, ok := recovered.(badJSON); !ok {
				panic(recovered)
			}
			fields, result = paymentFields{}, parsedNotJSON
		}
	}()
	r := &jsonReader{s: text}
	r.skipWhitespace()
	isObject := r.peek() == '{'
	if isObject {
		r.object(&fields)
	} else {
		r.value(nil)
	}
	r.skipWhitespace()
	if r.i != len(r.s) {
		r.fail() // trailing characters
	}
	if !isObject {
		return fields, parsedNotObject
	}
	return fields, parsedObject
}

func (r *jsonReader) value(capture *paymentField) {
	switch c := r.peek(); {
	case c == '"':
		text := r.str(capture != nil)
		if capture != nil {
			*capture = paymentField{kind: fieldString, text: text}
		}
	case c == '{':
		r.setOther(capture)
		r.object(nil)
	case c == '[':
		r.setOther(capture)
		r.array()
	case c == 't':
		r.setOther(capture)
		r.literal("true")
	case c == 'f':
		r.setOther(capture)
		r.literal("false")
	case c == 'n':
		r.setOther(capture)
		r.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		integer, isInteger := r.number()
		if capture != nil {
			if isInteger {
				*capture = paymentField{kind: fieldInteger, integer: integer}
			} else {
				*capture = paymentField{kind: fieldOther}
			}
		}
	default:
		r.fail()
	}
}

func (r *jsonReader) setOther(capture *paymentField) {
	if capture != nil {
		*capture = paymentField{kind: fieldOther}
	}
}

func (r *jsonReader) literal(word string) {
	if !strings.HasPrefix(string(r.s[r.i:min(len(r.s), r.i+len(word))]), word) {
		r.fail()
	}
	r.i += len(word)
}

func (r *jsonReader) enter() {
	r.depth++
	if r.depth > maxDepth {
		r.fail()
	}
}

func (r *jsonReader) array() {
	r.enter()
	r.i++ // [
	r.skipWhitespace()
	if r.peek() == ']' {
		r.i++
		r.depth--
		return
	}
	for {
		r.value(nil)
		r.skipWhitespace()
		c := r.peek()
		r.i++
		if c == ']' {
			break
		}
		if c != ',' {
			r.fail()
		}
		r.skipWhitespace()
	}
	r.depth--
}

// object reads an object; at the top level (fields != nil) the payment's
// fields are kept.
func (r *jsonReader) object(fields *paymentFields) {
	r.enter()
	r.i++ // {
	r.skipWhitespace()
	if r.peek() == '}' {
		r.i++
		r.depth--
		return
	}
	for {
		if r.peek() != '"' {
			r.fail()
		}
		key := r.str(fields != nil)
		r.skipWhitespace()
		if r.peek() != ':' {
			r.fail()
		}
		r.i++
		r.skipWhitespace()
		var capture *paymentField
		if fields != nil {
			switch key {
			case "payment_id":
				capture = &fields.paymentID
			case "account":
				capture = &fields.account
			case "amount":
				capture = &fields.amount
			}
		}
		r.value(capture) // a duplicate key replaces the earlier value
		r.skipWhitespace()
		c := r.peek()
		r.i++
		if c == '}' {
			break
		}
		if c != ',' {
			r.fail()
		}
		r.skipWhitespace()
	}
	r.depth--
}

func (r *jsonReader) hex4() rune {
	if r.i+4 > len(r.s) {
		r.fail()
	}
	v, err := strconv.ParseUint(string(r.s[r.i:r.i+4]), 16, 32)
	if err != nil || strings.ContainsAny(string(r.s[r.i:r.i+4]), "+-_") {
		r.fail()
	}
	r.i += 4
	return rune(v)
}

// str reads a string (the opening quote is at r.i), decoded if keep.
func (r *jsonReader) str(keep bool) string {
	r.i++
	var out strings.Builder
	for {
		if r.i >= len(r.s) {
			r.fail()
		}
		c := r.s[r.i]
		switch {
		case c == '"':
			r.i++
			return out.String()
		case c < 0x20:
			r.fail()
		case c == '\\':
			r.i++
			e := r.peek()
			r.i++
			switch e {
			case '"', '\\', '/':
				out.WriteByte(byte(e))
			case 'b':
				out.WriteByte('\b')
			case 'f':
				out.WriteByte('\f')
			case 'n':
				out.WriteByte('\n')
			case 'r':
				out.WriteByte('\r')
			case 't':
				out.WriteByte('\t')
			case 'u':
				cp := r.hex4()
				if cp >= 0xDC00 && cp <= 0xDFFF {
					r.fail() // a lone trailing surrogate
				}
				if cp >= 0xD800 && cp <= 0xDBFF {
					if r.i+2 > len(r.s) || r.s[r.i] != '\\' || r.s[r.i+1] != 'u' {
						r.fail()
					}
					r.i += 2
					low := r.hex4()
					if low < 0xDC00 || low > 0xDFFF {
						r.fail()
					}
					cp = 0x10000 + (cp-0xD800)<<10 + (low - 0xDC00)
				}
				if keep {
					out.WriteRune(cp)
				}
			default:
				r.fail()
			}
		case c < 0x80:
			// A run of plain ASCII, copied at once.
			start := r.i
			for r.i < len(r.s) {
				c := r.s[r.i]
				if c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
					break
				}
				r.i++
			}
			if keep {
				out.Write(r.s[start:r.i])
			}
		default:
			cp, size := utf8.DecodeRune(r.s[r.i:])
			if cp == utf8.RuneError && size <= 1 {
				r.fail()
			}
			if keep {
				out.Write(r.s[r.i : r.i+size])
			}
			r.i += size
		}
	}
}

// ---------------------------------------------------------------- numbers

var pow10 = func() [309]float64 {
	var table [309]float64
	for e := range table {
		// Correctly rounded, as serde_json's literal table.
		table[e], _ = strconv.ParseFloat("1e"+strconv.Itoa(e), 64)
	}
	return table
}()

const (
	u64MaxDiv10 = math.MaxUint64 / 10
	u64MaxMod10 = math.MaxUint64 % 10
)

func overflows(significand uint64, digit int) bool {
	return significand >= u64MaxDiv10 && (significand > u64MaxDiv10 || uint64(digit) > u64MaxMod10)
}

func (r *jsonReader) digit() int {
	c := r.peek()
	if c >= '0' && c <= '9' {
		return c - '0'
	}
	return -1
}

// fromParts is serde_json's f64_from_parts, as far as it can fail: only a
// non-negative exponent can overflow.
func (r *jsonReader) fromParts(significand uint64, exponent int32) {
	if exponent < 0 || significand == 0 {
		return
	}
	if exponent > 308 || math.IsInf(float64(significand)*pow10[exponent], 0) {
		r.fail()
	}
}

func (r *jsonReader) exponent(significand uint64, starting int32) {
	r.i++ // e or E
	positive := true
	if r.peek() == '+' {
		r.i++
	} else if r.peek() == '-' {
		positive = false
		r.i++
	}
	d := r.digit()
	if d < 0 {
		r.fail()
	}
	r.i++
	exp := int32(d)
	for d = r.digit(); d >= 0; d = r.digit() {
		r.i++
		if exp >= 214748364 && (exp > 214748364 || d > 7) {
			// The exponent overflows i32: the remaining digits are skipped
			// and only a positive exponent fails.
			for r.digit() >= 0 {
				r.i++
			}
			if significand != 0 && positive {
				r.fail()
			}
			return
		}
		exp = exp*10 + int32(d)
	}
	total := int64(starting) - int64(exp)
	if positive {
		total = int64(starting) + int64(exp)
	}
	total = max(math.MinInt32, min(math.MaxInt32, total))
	r.fromParts(significand, int32(total))
}

func (r *jsonReader) decimal(significand uint64, exponentBefore int32) {
	r.i++ // .
	if r.digit() < 0 {
		r.fail()
	}
	after := int32(0)
	for d := r.digit(); d >= 0; d = r.digit() {
		if overflows(significand, d) {
			// Further digits are ignored.
			for r.digit() >= 0 {
				r.i++
			}
			break
		}
		r.i++
		significand = significand*10 + uint64(d)
		after--
	}
	if c := r.peek(); c == 'e' || c == 'E' {
		r.exponent(significand, exponentBefore+after)
	} else {
		r.fromParts(significand, exponentBefore+after)
	}
}

func (r *jsonReader) fractionOrExponent(significand uint64, exponent int32) {
	switch r.peek() {
	case '.':
		r.decimal(significand, exponent)
	case 'e', 'E':
		r.exponent(significand, exponent)
	default:
		r.fromParts(significand, exponent)
	}
}

// number reads a number and says whether it is an integer as_i64 accepts.
func (r *jsonReader) number() (int64, bool) {
	negative := false
	if r.peek() == '-' {
		negative = true
		r.i++
	}
	d := r.digit()
	if d < 0 {
		r.fail()
	}
	r.i++
	significand := uint64(d)
	if d == 0 {
		if r.digit() >= 0 {
			r.fail() // a leading zero
		}
	} else {
		for d = r.digit(); d >= 0; d = r.digit() {
			if overflows(significand, d) {
				// A long integer: the remaining digits only scale it.
				exponent := int32(0)
				for r.digit() >= 0 {
					r.i++
					exponent++
				}
				r.fractionOrExponent(significand, exponent)
				return 0, false
			}
			r.i++
			significand = significand*10 + uint64(d)
		}
	}
	if c := r.peek(); c == '.' || c == 'e' || c == 'E' {
		r.fractionOrExponent(significand, 0)
		return 0, false
	}
	if !negative {
		if significand <= math.MaxInt64 {
			return int64(significand), true
		}
		return 0, false
	}
	if significand >= 1 && significand <= math.MaxInt64+1 {
		return int64(-significand), true
	}
	return 0, false
}
