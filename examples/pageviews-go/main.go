// Page views, in Go: the same processor as examples/pageviews (Rust), with
// byte-identical outputs and dead letters. It counts views per page in
// tumbling one-minute windows with a ten-second grace and emits each
// window's count once, when stream time passes its end plus the grace
// (Kafka Streams' suppress(untilWindowCloses)).
//
// Input: key = the page, the record's timestamp = when it was viewed; the
// value is not read. Output `counts`: key = the page, value =
// {"page":"/home","start":1700000040000,"end":1700000100000,"count":3}. A
// view whose window had closed is reported late; the manifest dead-letters
// it.
//
// Built by `onceflow build` with the onceflow Go SDK layer
// (wit_component/onceflow) and bindings from `wit-bindgen go`.
package main

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"wit_component/onceflow"
)

var windows = onceflow.Tumbling(time.Minute, 10*time.Second)

const store = "views"

type pageViews struct{}

func init() { onceflow.Register(pageViews{}) }

func (pageViews) Init(map[string]string) error {
	// Every 10 s of stream time: each point where a window closes.
	return onceflow.SchedulePunctuation(windows.PunctuationInterval())
}

func (pageViews) Process(ctx *onceflow.Context, record *onceflow.Record) error {
	page, err := record.KeyStr()
	if err != nil {
		return err
	}
	views := ctx.WindowStore(store)
	now, known := ctx.StreamTime()
	open := windows.OpenWindows(record.Timestamp, now, known)
	if len(open) == 0 {
		if !known {
			now = record.Timestamp
		}
		ctx.ReportLate("view of " + page + " at " + strconv.FormatInt(record.Timestamp, 10) +
			" arrived after its window closed (stream time " + strconv.FormatInt(now, 10) + ")")
		return nil
	}
	for _, start := range open {
		count, _, err := views.GetI64(record.Key, start)
		if err != nil {
			return err
		}
		if err := views.PutI64(record.Key, start, count+1); err != nil {
			return err
		}
	}
	return nil
}

func (pageViews) Punctuate(ctx *onceflow.Context, streamTime int64) error {
	views := ctx.WindowStore(store)
	_, err := windows.TakeClosed(views, streamTime, func(w onceflow.Window) error {
		if !utf8.Valid(w.Key) {
			return &onceflow.Error{Message: "a stored page is not UTF-8"}
		}
		if !utf8.Valid(w.Value) {
			return &onceflow.Error{Message: "a stored count is not UTF-8"}
		}
		var value strings.Builder
		value.WriteString(`{"page":`)
		writeJSONString(&value, w.Key)
		value.WriteString(`,"start":` + strconv.FormatInt(w.Start, 10))
		value.WriteString(`,"end":` + strconv.FormatInt(windows.End(w.Start), 10))
		value.WriteString(`,"count":` + string(w.Value) + `}`)
		return ctx.Emit("counts", w.Key, []byte(value.String()))
	})
	return err
}

// writeJSONString writes text (UTF-8) as a JSON string: quotes, backslashes
// and control characters escaped, nothing else.
func writeJSONString(out *strings.Builder, text []byte) {
	const hex = "0123456789abcdef"
	out.WriteByte('"')
	for _, c := range text {
		switch {
		case c == '"' || c == '\\':
			out.WriteByte('\\')
			out.WriteByte(c)
		case c < 0x20:
			out.WriteString(`\u00`)
			out.WriteByte(hex[c>>4])
			out.WriteByte(hex[c&0xf])
		default:
			out.WriteByte(c)
		}
	}
	out.WriteByte('"')
}
