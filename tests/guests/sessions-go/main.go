// Test guest, in Go: the same processor as tests/guests/sessions (Rust).
// Clicks counted per user and session with the SDK's SessionWindows (a
// session ends after 5 s without a click; 10 s of grace), each session
// emitted once when it closes, late clicks reported. Output `sessions`: key
// = user, value = "<start> <end> <count>".
package main

import (
	"strconv"
	"strings"
	"time"

	"wit_component/onceflow"
)

var sessionWindows = onceflow.SessionsWithGap(5*time.Second, 10*time.Second)

const store = "sessions"

type sessions struct{}

func init() { onceflow.Register(sessions{}) }

// count is a count stored as decimal text (0 if it is not one).
func count(value []byte) uint64 {
	n, err := strconv.ParseUint(strings.TrimPrefix(string(value), "+"), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func (sessions) Init(map[string]string) error {
	// At every advance of stream time: each session is emitted at the
	// record that closes it.
	return onceflow.SchedulePunctuation(time.Millisecond)
}

func (sessions) Process(ctx *onceflow.Context, record *onceflow.Record) error {
	user, err := record.KeyStr()
	if err != nil {
		return err
	}
	now, known := ctx.StreamTime()
	_, recorded, err := sessionWindows.Record(ctx.WindowStore(store), record.Key, record.Timestamp, now, known,
		func(a, b []byte) []byte { return strconv.AppendUint(nil, count(a)+count(b), 10) },
		func(old []byte, ok bool) []byte {
			if !ok {
				return []byte("1")
			}
			return strconv.AppendUint(nil, count(old)+1, 10)
		})
	if err != nil {
		return err
	}
	if !recorded {
		ctx.ReportLate("click of " + user + " at " + strconv.FormatInt(record.Timestamp, 10) +
			" after its session closed")
	}
	return nil
}

func (sessions) Punctuate(ctx *onceflow.Context, streamTime int64) error {
	_, err := sessionWindows.TakeClosed(ctx.WindowStore(store), streamTime, func(s onceflow.Session) error {
		value := strconv.FormatInt(s.Start, 10) + " " + strconv.FormatInt(s.End, 10) + " " +
			strconv.FormatUint(count(s.Value), 10)
		return ctx.Emit("sessions", s.Key, []byte(value))
	})
	return err
}
