package main

// JSON read as the Rust fraud example's serde_json (1.0, default features)
// reads it into a serde_json::Value, with its error messages, so that a
// malformed payment or account value is dead-lettered with the very reason
// the Rust processor gives: `expected value at line 1 column 1`, `EOF while
// parsing a string at line 1 column 12`, ...
//
// encoding/json accepts more (invalid UTF-8 and lone surrogates become
// U+FFFD, nesting up to 10000 levels, numbers that overflow f64) and words
// and places its errors differently, so this reader replays serde_json's
// parser instead: the same grammar, the same checks in the same order, and
// the error position (line, and column in bytes) computed as serde_json
// computes it for a byte slice.

import (
	"bytes"
	"math"
	"strconv"
	"unicode/utf8"
)

// jsonKind is what a top-level field holds, as far as the fraud check
// cares: a string, an integer Value::as_i64 accepts, or anything else.
type jsonKind int

const (
	jsonOther jsonKind = iota
	jsonString
	jsonInteger
)

type jsonField struct {
	kind    jsonKind
	text    string
	integer int64
}

// jsonFields are the fields of a top-level object, the last of duplicate
// keys winning; empty for any other top-level value (as Value::get on a
// non-object).
type jsonFields map[string]jsonField

const (
	eofList                  = "EOF while parsing a list"
	eofObject                = "EOF while parsing an object"
	eofString                = "EOF while parsing a string"
	eofValue                 = "EOF while parsing a value"
	expectedColon            = "expected `:`"
	expectedListCommaOrEnd   = "expected `,` or `]`"
	expectedObjectCommaOrEnd = "expected `,` or `}`"
	expectedIdent            = "expected ident"
	expectedValue            = "expected value"
	invalidEscape            = "invalid escape"
	invalidNumber            = "invalid number"
	numberOutOfRange         = "number out of range"
	invalidUnicode           = "invalid unicode code point"
	controlCharacter         = "control character (\\u0000-\\u001F) found while parsing a string"
	keyMustBeAString         = "key must be a string"
	loneLeadingSurrogate     = "lone leading surrogate in hex escape"
	trailingComma            = "trailing comma"
	trailingCharacters       = "trailing characters"
	unexpectedEndOfHexEscape = "unexpected end of hex escape"
	recursionLimitExceeded   = "recursion limit exceeded"
	u64MaxDiv10              = math.MaxUint64 / 10
	u64MaxMod10              = math.MaxUint64 % 10
	i32MaxDiv10, i32MaxMod10 = math.MaxInt32 / 10, math.MaxInt32 % 10
)

// pow10 is serde_json's POW10 table: 1e0 ..= 1e308, correctly rounded.
var pow10 = func() [309]float64 {
	var table [309]float64
	for e := range table {
		table[e], _ = strconv.ParseFloat("1e"+strconv.Itoa(e), 64)
	}
	return table
}()

// jsonFailure carries serde_json's message out of the reader (a panic).
type jsonFailure struct{ message string }

type jsonReader struct {
	s              []byte
	i              int
	remainingDepth int
}

// parseJSON reads a whole JSON text as serde_json::from_slice::<Value>
// does: its fields, or serde_json's message.
func parseJSON(text []byte) (fields jsonFields, message string, ok bool) {
	defer func() {
		if recovered := recover(); recovered != nil {
			failure, isFailure := recovered.(jsonFailure)
			if !isFailure {
				panic(recovered)
			}
			fields, message, ok = nil, failure.message, false
		}
	}()
	r := &jsonReader{s: text, remainingDepth: 128}
	return r.top(), "", true
}

// at fails at index, the column pulled back by back (not below 0), as
// SliceRead::position_of_index places it.
func (r *jsonReader) at(index int, message string, back int) {
	startOfLine := bytes.LastIndexByte(r.s[:index], '\n') + 1
	line := 1 + bytes.Count(r.s[:startOfLine], []byte{'\n'})
	column := max(0, index-startOfLine-back)
	panic(jsonFailure{message + " at line " + strconv.Itoa(line) + " column " + strconv.Itoa(column)})
}

func (r *jsonReader) fail(message string)     { r.at(r.i, message, 0) }
func (r *jsonReader) peekFail(message string) { r.at(min(len(r.s), r.i+1), message, 0) }

func (r *jsonReader) peekOrNull() byte {
	if r.i < len(r.s) {
		return r.s[r.i]
	}
	return 0
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// whitespace skips whitespace and returns the next byte, or -1 at the end.
func (r *jsonReader) whitespace() int {
	for r.i < len(r.s) {
		switch c := r.s[r.i]; c {
		case ' ', '\n', '\t', '\r':
			r.i++
		default:
			return int(c)
		}
	}
	return -1
}

func (r *jsonReader) top() jsonFields {
	fields := jsonFields{}
	if r.whitespace() == '{' {
		r.enter()
		r.i++
		r.object(fields)
		r.leave()
	} else {
		r.value(false)
	}
	if r.whitespace() != -1 {
		r.peekFail(trailingCharacters)
	}
	return fields
}

// value reads a value; with keep, a string or integer's summary.
func (r *jsonReader) value(keep bool) jsonField {
	c := r.whitespace()
	switch {
	case c == -1:
		r.peekFail(eofValue)
	case c == 'n':
		r.i++
		r.ident("ull")
	case c == 't':
		r.i++
		r.ident("rue")
	case c == 'f':
		r.i++
		r.ident("alse")
	case c == '-':
		r.i++
		return r.integer(false)
	case isDigit(byte(c)):
		return r.integer(true)
	case c == '"':
		r.i++
		text := r.str()
		if keep {
			return jsonField{kind: jsonString, text: text}
		}
	case c == '[':
		r.enter()
		r.i++
		r.array()
		r.leave()
	case c == '{':
		r.enter()
		r.i++
		r.object(nil)
		r.leave()
	default:
		r.peekFail(expectedValue)
	}
	return jsonField{}
}

func (r *jsonReader) enter() {
	r.remainingDepth--
	if r.remainingDepth == 0 {
		r.peekFail(recursionLimitExceeded)
	}
}

// leave steps past the closing bracket or brace.
func (r *jsonReader) leave() {
	r.remainingDepth++
	r.i++
}

func (r *jsonReader) ident(rest string) {
	for k := 0; k < len(rest); k++ {
		if r.i >= len(r.s) {
			r.fail(eofValue)
		}
		c := r.s[r.i]
		r.i++
		if c != rest[k] {
			r.fail(expectedIdent)
		}
	}
}

// array reads the elements, up to (not past) the closing bracket.
func (r *jsonReader) array() {
	for first := true; ; first = false {
		c := r.whitespace()
		switch {
		case c == -1:
			r.peekFail(eofList)
		case c == ']':
			return
		case first:
		case c == ',':
			r.i++
			switch r.whitespace() {
			case ']':
				r.peekFail(trailingComma)
			case -1:
				r.peekFail(eofValue)
			}
		default:
			r.peekFail(expectedListCommaOrEnd)
		}
		r.value(false)
	}
}

// object reads the members, up to (not past) the closing brace, keeping
// their values' summaries in fields unless it is nil.
func (r *jsonReader) object(fields jsonFields) {
	for first := true; ; first = false {
		c := r.whitespace()
		switch {
		case c == -1:
			r.peekFail(eofObject)
		case c == '}':
			return
		case first:
			if c != '"' {
				r.peekFail(keyMustBeAString)
			}
		case c == ',':
			r.i++
			switch r.whitespace() {
			case '"':
			case '}':
				r.peekFail(trailingComma)
			case -1:
				r.peekFail(eofValue)
			default:
				r.peekFail(keyMustBeAString)
			}
		default:
			r.peekFail(expectedObjectCommaOrEnd)
		}
		r.i++ // "
		key := r.str()
		switch r.whitespace() {
		case ':':
			r.i++
		case -1:
			r.peekFail(eofObject)
		default:
			r.peekFail(expectedColon)
		}
		value := r.value(fields != nil)
		if fields != nil {
			fields[key] = value // a duplicate key replaces the earlier value
		}
	}
}

// str reads a string's text, the opening quote read.
func (r *jsonReader) str() string {
	var scratch []byte
	escaped := false
	start := r.i
	for {
		j := r.i
		for j < len(r.s) && r.s[j] != '"' && r.s[j] != '\\' && r.s[j] >= 0x20 {
			j++
		}
		if j == len(r.s) {
			r.i = j
			r.fail(eofString)
		}
		switch r.s[j] {
		case '"':
			text := r.s[start:j]
			if escaped {
				text = append(scratch, text...)
			}
			r.i = j + 1
			if !utf8.Valid(text) {
				// serde_json points back from the closing quote by the
				// invalid tail's length (in the decoded text).
				r.at(r.i, invalidUnicode, len(text)-validUpTo(text))
			}
			return string(text)
		case '\\':
			scratch = append(scratch, r.s[start:j]...)
			escaped = true
			r.i = j + 1
			scratch = r.escape(scratch)
			start = r.i
		default:
			r.i = j + 1
			r.fail(controlCharacter)
		}
	}
}

// validUpTo is the length of the longest valid UTF-8 prefix (Rust's
// Utf8Error::valid_up_to; Go's utf8 rejects what Rust's from_utf8 rejects).
func validUpTo(text []byte) int {
	i := 0
	for i < len(text) {
		c, size := utf8.DecodeRune(text[i:])
		if c == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return i
}

func (r *jsonReader) escape(out []byte) []byte {
	if r.i >= len(r.s) {
		r.fail(eofString)
	}
	c := r.s[r.i]
	r.i++
	switch c {
	case '"', '\\', '/':
		return append(out, c)
	case 'b':
		return append(out, '\b')
	case 'f':
		return append(out, '\f')
	case 'n':
		return append(out, '\n')
	case 'r':
		return append(out, '\r')
	case 't':
		return append(out, '\t')
	case 'u':
		return r.unicodeEscape(out)
	}
	r.fail(invalidEscape)
	return out
}

func hexValue(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func (r *jsonReader) hex4() rune {
	if len(r.s)-r.i < 4 {
		r.i = len(r.s)
		r.fail(eofString)
	}
	value, valid := 0, true
	for k := 0; k < 4; k++ {
		v := hexValue(r.s[r.i+k])
		valid = valid && v >= 0
		value = value*16 + v
	}
	r.i += 4
	if !valid {
		r.fail(invalidEscape)
	}
	return rune(value)
}

func (r *jsonReader) unicodeEscape(out []byte) []byte {
	n := r.hex4()
	if n >= 0xDC00 && n <= 0xDFFF {
		r.fail(loneLeadingSurrogate)
	}
	if n < 0xD800 || n > 0xDBFF {
		return utf8.AppendRune(out, n)
	}
	for _, expected := range []byte{'\\', 'u'} {
		if r.i >= len(r.s) {
			r.fail(eofString)
		}
		c := r.s[r.i]
		r.i++
		if c != expected {
			r.fail(unexpectedEndOfHexEscape)
		}
	}
	n2 := r.hex4()
	if n2 < 0xDC00 || n2 > 0xDFFF {
		r.fail(loneLeadingSurrogate)
	}
	return utf8.AppendRune(out, 0x10000+(n-0xD800)<<10+(n2-0xDC00))
}

// overflows is serde_json's `overflow!(significand * 10 + digit, u64::MAX)`.
func overflows(significand uint64, digit byte) bool {
	return significand >= u64MaxDiv10 && (significand > u64MaxDiv10 || uint64(digit) > u64MaxMod10)
}

// integer reads a number (its sign read): an integer field when
// Value::as_i64 accepts it.
func (r *jsonReader) integer(positive bool) jsonField {
	if r.i >= len(r.s) {
		r.fail(eofValue)
	}
	c := r.s[r.i]
	r.i++
	if c == '0' {
		if isDigit(r.peekOrNull()) {
			r.peekFail(invalidNumber)
		}
		return r.number(positive, 0)
	}
	if !isDigit(c) {
		r.fail(invalidNumber)
	}
	significand := uint64(c - '0')
	for {
		d := r.peekOrNull()
		if !isDigit(d) {
			return r.number(positive, significand)
		}
		if overflows(significand, d-'0') {
			r.longInteger(significand)
			return jsonField{}
		}
		r.i++
		significand = significand*10 + uint64(d-'0')
	}
}

func (r *jsonReader) number(positive bool, significand uint64) jsonField {
	switch r.peekOrNull() {
	case '.':
		r.decimal(significand, 0)
		return jsonField{}
	case 'e', 'E':
		r.exponent(significand, 0)
		return jsonField{}
	}
	if positive {
		if significand <= math.MaxInt64 {
			return jsonField{kind: jsonInteger, integer: int64(significand)}
		}
		return jsonField{}
	}
	// serde_json makes -0 and anything below i64::MIN a float.
	if significand >= 1 && significand <= 1<<63 {
		return jsonField{kind: jsonInteger, integer: int64(-significand)}
	}
	return jsonField{}
}

func (r *jsonReader) longInteger(significand uint64) {
	exponent := int32(0)
	for {
		c := r.peekOrNull()
		switch {
		case isDigit(c):
			r.i++
			exponent++
		case c == '.':
			r.decimal(significand, exponent)
			return
		default:
			r.exponentOrParts(significand, exponent)
			return
		}
	}
}

func (r *jsonReader) decimal(significand uint64, exponentBefore int32) {
	r.i++ // .
	after := int32(0)
	for isDigit(r.peekOrNull()) {
		d := r.peekOrNull() - '0'
		if overflows(significand, d) {
			// Further digits are ignored.
			for isDigit(r.peekOrNull()) {
				r.i++
			}
			r.exponentOrParts(significand, exponentBefore+after)
			return
		}
		r.i++
		significand = significand*10 + uint64(d)
		after--
	}
	if after == 0 {
		if r.i < len(r.s) {
			r.peekFail(invalidNumber)
		}
		r.peekFail(eofValue)
	}
	r.exponentOrParts(significand, exponentBefore+after)
}

func (r *jsonReader) exponentOrParts(significand uint64, exponent int32) {
	if c := r.peekOrNull(); c == 'e' || c == 'E' {
		r.exponent(significand, exponent)
	} else {
		r.fromParts(significand, exponent)
	}
}

func (r *jsonReader) exponent(significand uint64, starting int32) {
	r.i++ // e or E
	positive := true
	switch r.peekOrNull() {
	case '+':
		r.i++
	case '-':
		r.i++
		positive = false
	}
	if r.i >= len(r.s) {
		r.fail(eofValue)
	}
	c := r.s[r.i]
	r.i++
	if !isDigit(c) {
		r.fail(invalidNumber)
	}
	exp := int32(c - '0')
	for isDigit(r.peekOrNull()) {
		d := r.peekOrNull() - '0'
		r.i++
		if exp >= i32MaxDiv10 && (exp > i32MaxDiv10 || int32(d) > i32MaxMod10) {
			// The exponent overflows i32: an error for a positive one (but
			// 0 stays 0), else the number is 0.
			if significand != 0 && positive {
				r.fail(numberOutOfRange)
			}
			for isDigit(r.peekOrNull()) {
				r.i++
			}
			return
		}
		exp = exp*10 + int32(d)
	}
	final := int64(starting) - int64(exp)
	if positive {
		final = int64(starting) + int64(exp)
	}
	r.fromParts(significand, int32(max(math.MinInt32, min(math.MaxInt32, final))))
}

// fromParts is serde_json's f64_from_parts, as far as it can fail: only a
// non-negative exponent can overflow.
func (r *jsonReader) fromParts(significand uint64, exponent int32) {
	if exponent < 0 || significand == 0 {
		return
	}
	if exponent > 308 || math.IsInf(float64(significand)*pow10[exponent], 0) {
		r.fail(numberOutOfRange)
	}
}
