// Package onceflow is the thin Go SDK layer over the bindings `wit-bindgen
// go` generates from wit/processor.wit. `onceflow build` writes it into the
// build's Go module (`wit_component`) next to the bindings and the
// processor's own files (package main).
//
// A processor implements Processor and registers itself in an init
// function:
//
//	package main
//
//	import "wit_component/onceflow"
//
//	type counter struct{}
//
//	func (counter) Process(ctx *onceflow.Context, record *onceflow.Record) error {
//		counts := ctx.Store("counts")
//		n, _, err := counts.GetI64(record.Key)
//		if err != nil {
//			return err
//		}
//		if err := counts.PutI64(record.Key, n+1); err != nil {
//			return err
//		}
//		return ctx.Emit("counts", record.Key, []byte(strconv.FormatInt(n+1, 10)))
//	}
//
//	func init() { onceflow.Register(counter{}) }
//
// The batch loop is the Rust SDK's: `begin-record` before each record, and
// an error returned for a record comes back to the host as a
// `process-error` naming it, so the deployment's error policy (fail, skip,
// dead-letter) applies to that record alone. State and output failures are
// *Error values with the Rust SDK's messages. A panic is a bug: it is
// logged at level error with its stack and reported for the record as
// `processor error: ...`.
//
// Time is stream time (ctx.StreamTime), as in the Rust SDK: window stores
// (ctx.WindowStore), Tumbling / Hopping windows to assign records to
// windows, SessionsWithGap for sessions, SchedulePunctuation from Init, and
// a Punctuate method that emits closed windows (TimeWindows.TakeClosed,
// SessionWindows.TakeClosed):
//
//	var windows = onceflow.Tumbling(time.Minute, 10*time.Second)
//
//	func (views) Init(map[string]string) error {
//		return onceflow.SchedulePunctuation(windows.PunctuationInterval())
//	}
//
//	func (views) Punctuate(ctx *onceflow.Context, streamTime int64) error {
//		_, err := windows.TakeClosed(ctx.WindowStore("views"), streamTime, func(w onceflow.Window) error {
//			return ctx.Emit("counts", w.Key, w.Value)
//		})
//		return err
//	}
package onceflow

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"time"
	"unicode/utf8"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
	"wit_component/onceflow_processor_context"
	"wit_component/onceflow_processor_log"
	"wit_component/onceflow_processor_output"
	"wit_component/onceflow_processor_state"
	"wit_component/onceflow_processor_types"
	"wit_component/onceflow_processor_windows"
)

// Record is one input record. A nil Key or Value is a null key or a
// tombstone.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Timestamp int64
	Key       []byte
	Value     []byte
	Headers   []Header
}

// KeyStr returns the key as UTF-8 text, or an *Error (the Rust SDK's
// message) when it is null or not UTF-8.
func (r *Record) KeyStr() (string, error) { return recordText(r.Key, "key") }

// ValueStr returns the value as UTF-8 text, or an *Error when it is absent
// (a tombstone) or not UTF-8.
func (r *Record) ValueStr() (string, error) { return recordText(r.Value, "value") }

// ValueJSON parses the value as JSON into v (as encoding/json's Unmarshal):
// what the host hands over for inputs of format `json` or `avro`
// (docs/formats.md). An *Error when the value is absent or not JSON that
// fits v.
func (r *Record) ValueJSON(v any) error {
	if r.Value == nil {
		return Errorf("record has no value")
	}
	if err := json.Unmarshal(r.Value, v); err != nil {
		return Errorf("record value is not the expected JSON: %v", err)
	}
	return nil
}

func recordText(data []byte, what string) (string, error) {
	if data == nil {
		return "", Errorf("record has no %s", what)
	}
	// As Rust's str::from_utf8: no surrogates, no overlong forms.
	if !utf8.Valid(data) {
		return "", Errorf("record %s is not UTF-8 text", what)
	}
	return string(data), nil
}

// Header is a Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// Error is a record the processor rejects: the message goes to the
// dead-letter topic and the logs.
type Error struct {
	Message string
}

func (e *Error) Error() string { return e.Message }

// Errorf makes an *Error.
func Errorf(format string, args ...any) *Error {
	return &Error{Message: fmt.Sprintf(format, args...)}
}

// Processor handles one record at a time.
type Processor interface {
	Process(ctx *Context, record *Record) error
}

// Initializer is implemented by processors that read the manifest's
// [config] table once per instance (and schedule punctuation there).
type Initializer interface {
	Init(config map[string]string) error
}

// Punctuator is implemented by processors that act as stream time passes:
// Punctuate is called when the task's stream time reaches a point
// scheduled with SchedulePunctuation (from Init), right after the record
// that carried it there and in the same transaction. Emit closed windows
// here (see TimeWindows.TakeClosed). An error stops the deployment: no
// record is to blame. A processor without it is never punctuated.
type Punctuator interface {
	Punctuate(ctx *Context, streamTime int64) error
}

var (
	registered Processor
	config     = map[string]string{}
)

// The garbage collector runs only when this layer says so, between records.
//
// The host copies a batch (and every state read) into the instance through
// `cabi_realloc`, which allocates from Go's heap; an allocation there may
// have to finish a collection, and Go's mark termination reads the wall
// clock (`time.now` -> WASI `clock_time_get`), an import call that the
// component model forbids inside `cabi_realloc`: the instance traps ("cannot
// leave component instance"). The bindings' runtime pauses only the
// monotonic clock around its allocations. So automatic collection is off
// (GOGC=off, no memory limit) and collectGarbage runs a full collection
// before a record once gcEveryBytes were allocated since the last one.
const gcEveryBytes = 8 << 20

var (
	heapAllocs        = []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	allocatedAtLastGC uint64
)

func init() { debug.SetGCPercent(-1) }

func collectGarbage() {
	metrics.Read(heapAllocs)
	allocated := heapAllocs[0].Value.Uint64()
	if allocated-allocatedAtLastGC >= gcEveryBytes {
		runtime.GC()
		allocatedAtLastGC = allocated
	}
}

// Register makes p the processor; call it from an init function.
func Register(p Processor) { registered = p }

// Level is a log level.
type Level = onceflow_processor_log.Level

// The log levels.
const (
	Trace = onceflow_processor_log.Level_Trace
	Debug = onceflow_processor_log.Level_Debug
	Info  = onceflow_processor_log.Level_Info
	Warn  = onceflow_processor_log.Level_Warn
	Fail  = onceflow_processor_log.Level_Error
)

// Context is what a processor may do while processing a record (or
// punctuating).
type Context struct {
	index    uint32
	inRecord bool
}

// Store is a state store declared in the manifest's `stores`.
func (*Context) Store(name string) Store { return Store{name: name} }

// WindowStore is a window store declared under [window-stores] in the
// manifest.
func (*Context) WindowStore(name string) WindowStore { return WindowStore{name: name} }

// StreamTime returns the task's stream time, ms: the largest record
// timestamp it has seen, counting this record (in Punctuate, the time it
// was called for); false before the task's first record.
func (*Context) StreamTime() (int64, bool) {
	t := onceflow_processor_context.StreamTime()
	if t.IsNone() {
		return 0, false
	}
	return t.Some(), true
}

// ReportLate reports this record as late (its window had closed): leave no
// other mark for it and return nil; the host counts and drops it or hands
// it to the error policy with message, as the manifest's [time]
// late-records says. Outside Process it does nothing.
func (c *Context) ReportLate(message string) {
	if c.inRecord {
		onceflow_processor_context.LateRecord(c.index, message)
	}
}

// Config returns a value of the manifest's [config] table.
func (*Context) Config(key string) (string, bool) {
	value, ok := config[key]
	return value, ok
}

// Log writes a line to the host's log.
func (*Context) Log(level Level, message string) {
	onceflow_processor_log.Write(level, message)
}

// Emit writes a record (no headers) to the topic the manifest maps alias
// to; a nil key or value is a null key or a tombstone.
func (c *Context) Emit(alias string, key, value []byte) error {
	return c.EmitWith(alias, key, value, nil)
}

// EmitWith is Emit with headers.
func (*Context) EmitWith(alias string, key, value []byte, headers []Header) error {
	witHeaders := make([]onceflow_processor_types.Header, len(headers))
	for i, h := range headers {
		witHeaders[i] = onceflow_processor_types.Header{Key: h.Key, Value: h.Value}
	}
	result := onceflow_processor_output.Emit(alias, option(key), option(value), witHeaders)
	if !result.IsErr() {
		return nil
	}
	e := result.Err()
	switch e.Tag() {
	case onceflow_processor_types.OutputError_UnknownAlias:
		return Errorf("unknown output alias \"%s\": declare it under [outputs] in onceflow.toml", e.UnknownAlias())
	default:
		return Errorf("output record too large: the host accepts at most %d bytes", e.TooLarge())
	}
}

func option(bytes []byte) witTypes.Option[[]uint8] {
	if bytes == nil {
		return witTypes.None[[]uint8]()
	}
	return witTypes.Some[[]uint8](bytes)
}

// Store reads and writes one state store.
type Store struct {
	name string
}

func stateError(e onceflow_processor_types.StateError) *Error {
	// %s with explicit quotes: the Rust SDK does not escape the names.
	switch e.Tag() {
	case onceflow_processor_types.StateError_UnknownStore:
		return Errorf("unknown state store \"%s\": declare it under stores in onceflow.toml", e.UnknownStore())
	case onceflow_processor_types.StateError_TooLarge:
		return Errorf("state key or value too large: the host accepts at most %d bytes", e.TooLarge())
	case onceflow_processor_types.StateError_ReadOnly:
		return Errorf("\"%s\" is a table: the host writes it from its topic, a processor only reads it", e.ReadOnly())
	case onceflow_processor_types.StateError_WrongKind:
		return Errorf("\"%s\" is of the other kind: use ctx.window_store for a store under window-stores in onceflow.toml, ctx.store for one under stores", e.WrongKind())
	default:
		return Errorf("state error %d", e.Tag())
	}
}

// parseI64 is Rust's i64::from_str: an optional sign and ASCII digits,
// nothing else.
func parseI64(value []byte) (int64, bool) {
	text := string(value)
	digits := text
	if len(digits) > 0 && (digits[0] == '+' || digits[0] == '-') {
		digits = digits[1:]
	}
	if len(digits) == 0 {
		return 0, false
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	return n, err == nil
}

// Get returns the value of key and whether it is present.
func (s Store) Get(key []byte) ([]byte, bool, error) {
	result := onceflow_processor_state.Get(s.name, key)
	if result.IsErr() {
		return nil, false, stateError(result.Err())
	}
	value := result.Ok()
	if value.IsNone() {
		return nil, false, nil
	}
	// The bindings' slice points into memory the host wrote for this call.
	return append([]byte{}, value.Some()...), true, nil
}

// GetI64 returns the value of key as an integer stored in decimal text (as
// PutI64 writes it); 0 and false when the key is absent.
func (s Store) GetI64(key []byte) (int64, bool, error) {
	value, ok, err := s.Get(key)
	if err != nil || !ok {
		return 0, false, err
	}
	if n, ok := parseI64(value); ok {
		return n, true, nil
	}
	return 0, false, Errorf("state store \"%s\": the value of key \"%s\" is not a decimal integer", s.name, EscapeASCII(key))
}

// Put sets key to value.
func (s Store) Put(key, value []byte) error {
	if result := onceflow_processor_state.Put(s.name, key, value); result.IsErr() {
		return stateError(result.Err())
	}
	return nil
}

// PutI64 sets key to value written as decimal text.
func (s Store) PutI64(key []byte, value int64) error {
	return s.Put(key, []byte(strconv.FormatInt(value, 10)))
}

// Delete removes key.
func (s Store) Delete(key []byte) error {
	if result := onceflow_processor_state.Delete(s.name, key); result.IsErr() {
		return stateError(result.Err())
	}
	return nil
}

// ScanPrefix calls visit for every entry whose key starts with prefix, in
// ascending key order, fetching 256 entries at a time.
func (s Store) ScanPrefix(prefix []byte, visit func(key, value []byte) error) error {
	const page = 256
	after := witTypes.None[[]uint8]()
	for {
		result := onceflow_processor_state.ScanPrefix(s.name, prefix, after, page)
		if result.IsErr() {
			return stateError(result.Err())
		}
		entries := result.Ok()
		for _, e := range entries {
			if err := visit(append([]byte{}, e.Key...), append([]byte{}, e.Value...)); err != nil {
				return err
			}
		}
		if len(entries) < page {
			return nil
		}
		after = witTypes.Some[[]uint8](append([]byte{}, entries[len(entries)-1].Key...))
	}
}

// DefaultWindowPage is how many windows WindowStore.FetchAll asks the host
// for at a time.
const DefaultWindowPage = 256

// Window is a window of a window store: a key, the window's start (ms since
// the Unix epoch) and its value.
type Window struct {
	Key   []byte
	Start int64
	Value []byte
}

func windowOf(e onceflow_processor_types.WindowEntry) Window {
	// The bindings' slices point into memory the host wrote for the call.
	return Window{Key: append([]byte{}, e.Key...), Start: e.Start, Value: append([]byte{}, e.Value...)}
}

// WindowStore reads and writes one window store, declared under
// [window-stores.NAME] in the manifest: a value per key and window start.
// A window whose start is at or before `stream time - retention` has
// expired: reads no longer see it and writes to it are ignored.
type WindowStore struct {
	name string
}

// Name is the store's name.
func (s WindowStore) Name() string { return s.name }

// Get returns the value of the window of key starting at start and whether
// it is present.
func (s WindowStore) Get(key []byte, start int64) ([]byte, bool, error) {
	result := onceflow_processor_windows.Get(s.name, key, start)
	if result.IsErr() {
		return nil, false, stateError(result.Err())
	}
	value := result.Ok()
	if value.IsNone() {
		return nil, false, nil
	}
	return append([]byte{}, value.Some()...), true, nil
}

// GetI64 returns the value of a window as an integer in decimal text (as
// PutI64 writes it); 0 and false when the window is absent.
func (s WindowStore) GetI64(key []byte, start int64) (int64, bool, error) {
	value, ok, err := s.Get(key, start)
	if err != nil || !ok {
		return 0, false, err
	}
	if n, ok := parseI64(value); ok {
		return n, true, nil
	}
	return 0, false, Errorf("window store \"%s\": the window of key \"%s\" at %d is not an integer", s.name, EscapeASCII(key), start)
}

// Put sets the value of the window of key starting at start.
func (s WindowStore) Put(key []byte, start int64, value []byte) error {
	if result := onceflow_processor_windows.Put(s.name, key, start, value); result.IsErr() {
		return stateError(result.Err())
	}
	return nil
}

// PutI64 sets a window's value to value written as decimal text.
func (s WindowStore) PutI64(key []byte, start int64, value int64) error {
	return s.Put(key, start, []byte(strconv.FormatInt(value, 10)))
}

// Delete removes the window of key starting at start.
func (s WindowStore) Delete(key []byte, start int64) error {
	if result := onceflow_processor_windows.Delete(s.name, key, start); result.IsErr() {
		return stateError(result.Err())
	}
	return nil
}

// Fetch returns the windows of key whose start is in [earliest, latest], by
// start.
func (s WindowStore) Fetch(key []byte, earliest, latest int64) ([]Window, error) {
	result := onceflow_processor_windows.Fetch(s.name, key, earliest, latest)
	if result.IsErr() {
		return nil, stateError(result.Err())
	}
	entries := result.Ok()
	windows := make([]Window, len(entries))
	for i, e := range entries {
		windows[i] = windowOf(e)
	}
	return windows, nil
}

// FetchAll calls visit for every window of every key whose start is in
// [earliest, latest], in (key, start) order, fetching DefaultWindowPage
// windows at a time; it stops at the first error visit returns.
func (s WindowStore) FetchAll(earliest, latest int64, visit func(Window) error) error {
	after := witTypes.None[onceflow_processor_types.WindowKey]()
	for {
		result := onceflow_processor_windows.FetchAll(s.name, earliest, latest, after, DefaultWindowPage)
		if result.IsErr() {
			return stateError(result.Err())
		}
		entries := result.Ok()
		var last Window
		for _, e := range entries {
			last = windowOf(e)
			if err := visit(last); err != nil {
				return err
			}
		}
		if len(entries) < DefaultWindowPage {
			return nil
		}
		after = witTypes.Some(onceflow_processor_types.WindowKey{Key: last.Key, Start: last.Start})
	}
}

// TimeWindows are fixed-size windows aligned to the epoch, as Kafka
// Streams' TimeWindows: tumbling (advance = size) or hopping (advance <
// size), with a grace period. A window [start, start+size) is open until
// stream time reaches start+size+grace; a record all of whose windows have
// closed is late. Times are ms since the Unix epoch.
type TimeWindows struct {
	sizeMs, advanceMs, graceMs int64
}

// durationMs is d in whole ms; a negative duration counts as 0.
func durationMs(d time.Duration) int64 {
	if d < 0 {
		return 0
	}
	return d.Milliseconds()
}

// windowLength is d in ms, at least 1.
func windowLength(d time.Duration) int64 {
	if ms := durationMs(d); ms > 0 {
		return ms
	}
	return 1
}

// Tumbling returns windows of size one after the other, records later than
// grace after a window's end being late (sizes under 1 ms count as 1 ms).
func Tumbling(size, grace time.Duration) TimeWindows {
	s := windowLength(size)
	return TimeWindows{sizeMs: s, advanceMs: s, graceMs: durationMs(grace)}
}

// Hopping returns windows of size starting every advance (at most size), so
// a record falls in size/advance of them.
func Hopping(size, advance, grace time.Duration) TimeWindows {
	s := windowLength(size)
	return TimeWindows{sizeMs: s, advanceMs: min(windowLength(advance), s), graceMs: durationMs(grace)}
}

// SizeMs is the window size, ms.
func (w TimeWindows) SizeMs() int64 { return w.sizeMs }

// AdvanceMs is how far apart windows start, ms.
func (w TimeWindows) AdvanceMs() int64 { return w.advanceMs }

// GraceMs is the grace period, ms.
func (w TimeWindows) GraceMs() int64 { return w.graceMs }

func saturatingAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	if b < 0 && a < math.MinInt64-b {
		return math.MinInt64
	}
	return a + b
}

// End is the end (exclusive) of the window starting at start.
func (w TimeWindows) End(start int64) int64 { return saturatingAdd(start, w.sizeMs) }

// WindowsFor returns the starts of the windows that contain timestamp,
// ascending (Kafka Streams' windowsFor: no window starts before the epoch).
func (w TimeWindows) WindowsFor(timestamp int64) []int64 {
	// Wrapping, as the Rust SDK's i64 arithmetic.
	first := max(timestamp-w.sizeMs+w.advanceMs, 0)
	first -= first % w.advanceMs
	var starts []int64
	for start := first; start <= timestamp; start += w.advanceMs {
		starts = append(starts, start)
		if start > math.MaxInt64-w.advanceMs {
			break
		}
	}
	return starts
}

// IsClosed reports whether the window starting at start has closed at
// streamTime.
func (w TimeWindows) IsClosed(start, streamTime int64) bool {
	return saturatingAdd(w.End(start), w.graceMs) <= streamTime
}

// OpenWindows returns the windows containing timestamp that are still open
// at streamTime (all of them when the stream time is not known, before the
// first record: pass ctx.StreamTime()'s two results): none means the record
// is late.
func (w TimeWindows) OpenWindows(timestamp, streamTime int64, known bool) []int64 {
	starts := w.WindowsFor(timestamp)
	if !known {
		return starts
	}
	open := starts[:0]
	for _, start := range starts {
		if !w.IsClosed(start, streamTime) {
			open = append(open, start)
		}
	}
	return open
}

// PunctuationInterval is the stream-time punctuation interval that falls on
// every point where one of these windows closes (end+grace of each), so
// that TakeClosed in Punctuate emits each window at the record that closes
// it, as Kafka Streams' suppress does.
func (w TimeWindows) PunctuationInterval() time.Duration {
	offset := (w.sizeMs + w.graceMs) % w.advanceMs
	if offset < 0 {
		offset += w.advanceMs
	}
	a, b := w.advanceMs, offset
	for b != 0 {
		a, b = b, a%b
	}
	every := max(a, 1)
	if every > int64(math.MaxInt64/time.Millisecond) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(every) * time.Millisecond
}

// TakeClosed calls each on every window of store closed at streamTime, then
// deletes it (emit final), and returns how many there were.
func (w TimeWindows) TakeClosed(store WindowStore, streamTime int64, each func(Window) error) (int, error) {
	latest := saturatingAdd(saturatingAdd(streamTime, -w.graceMs), -w.sizeMs)
	var closed []Window
	err := store.FetchAll(math.MinInt64, latest, func(window Window) error {
		closed = append(closed, window)
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, window := range closed {
		if err := each(window); err != nil {
			return 0, err
		}
		if err := store.Delete(window.Key, window.Start); err != nil {
			return 0, err
		}
	}
	return len(closed), nil
}

// SessionWindows are session windows, as Kafka Streams' SessionWindows and
// the Rust SDK's SessionWindows: a key's records closer than gap to each
// other form one session [start, end] (the first and last record's times),
// and a record bridging two sessions merges them. A record is late when
// its merged session ends before streamTime-gap-grace (Kafka Streams'
// rule); a session is closed, and emitted, once stream time passes
// end+2*gap+grace, when no record the rule accepts can touch it any more
// (docs/time.md). Sessions live in a window store under their
// start; the value is the session's end (8 bytes, big-endian) followed by
// the aggregate, as in every SDK.
type SessionWindows struct {
	gapMs, graceMs int64
}

// Session is a session of a SessionWindows store: its key, the first and
// last record's times (ms) and the aggregate.
type Session struct {
	Key        []byte
	Start, End int64
	Value      []byte
}

// SessionsWithGap returns sessions split by gap of inactivity, with grace
// for records out of order.
func SessionsWithGap(gap, grace time.Duration) SessionWindows {
	return SessionWindows{gapMs: durationMs(gap), graceMs: durationMs(grace)}
}

// GapMs is the inactivity gap, ms.
func (w SessionWindows) GapMs() int64 { return w.gapMs }

// GraceMs is the grace period, ms.
func (w SessionWindows) GraceMs() int64 { return w.graceMs }

// IsLate reports whether a record is late at streamTime when its session
// (merged with the sessions it touches) ends at end: end <
// streamTime-gap-grace.
func (w SessionWindows) IsLate(end, streamTime int64) bool {
	return saturatingAdd(saturatingAdd(end, w.gapMs), w.graceMs) < streamTime
}

// IsClosed reports whether a session ending at end is closed at
// streamTime: no record IsLate accepts can touch it any more, streamTime >
// end+2*gap+grace.
func (w SessionWindows) IsClosed(end, streamTime int64) bool {
	reach := saturatingAdd(saturatingAdd(end, w.gapMs), w.gapMs)
	return saturatingAdd(reach, w.graceMs) < streamTime
}

// decodeSession reads a window of a session store: false when its value is
// shorter than the 8 bytes of the end.
func decodeSession(window Window) (Session, bool) {
	if len(window.Value) < 8 {
		return Session{}, false
	}
	return Session{Key: window.Key, Start: window.Start, End: int64(binary.BigEndian.Uint64(window.Value)), Value: window.Value[8:]}, true
}

// Record adds a record of key at timestamp to store: it merges the
// sessions the record touches into one (their aggregates folded with
// merge, oldest first) and adds the record with add (ok false: a new
// session). It returns the session, or false when the record is late
// (report it with ctx.ReportLate). Pass ctx.StreamTime()'s two results as
// streamTime and known (before the first record nothing is late).
func (w SessionWindows) Record(store WindowStore, key []byte, timestamp, streamTime int64, known bool,
	merge func(a, b []byte) []byte, add func(aggregate []byte, ok bool) []byte) (Session, bool, error) {
	windows, err := store.Fetch(key, math.MinInt64, saturatingAdd(timestamp, w.gapMs))
	if err != nil {
		return Session{}, false, err
	}
	var touching []Session
	start, end := timestamp, timestamp
	for _, window := range windows {
		if s, ok := decodeSession(window); ok && saturatingAdd(s.End, w.gapMs) >= timestamp {
			touching = append(touching, s)
			start, end = min(start, s.Start), max(end, s.End)
		}
	}
	if known && w.IsLate(end, streamTime) {
		return Session{}, false, nil
	}
	var folded []byte
	for i, s := range touching {
		if i == 0 {
			folded = s.Value
		} else {
			folded = merge(folded, s.Value)
		}
		if err := store.Delete(key, s.Start); err != nil {
			return Session{}, false, err
		}
	}
	value := add(folded, len(touching) > 0)
	stored := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(value)), uint64(end))
	if err := store.Put(key, start, append(stored, value...)); err != nil {
		return Session{}, false, err
	}
	return Session{Key: key, Start: start, End: end, Value: value}, true, nil
}

// TakeClosed calls each on every session of store closed at streamTime,
// then deletes it (emit final), and returns how many there were.
func (w SessionWindows) TakeClosed(store WindowStore, streamTime int64, each func(Session) error) (int, error) {
	latest := saturatingAdd(saturatingAdd(saturatingAdd(streamTime, -w.graceMs), -w.gapMs), -w.gapMs)
	var closed []Session
	err := store.FetchAll(math.MinInt64, latest, func(window Window) error {
		if s, ok := decodeSession(window); ok && w.IsClosed(s.End, streamTime) {
			closed = append(closed, s)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, session := range closed {
		if err := each(session); err != nil {
			return 0, err
		}
		if err := store.Delete(session.Key, session.Start); err != nil {
			return 0, err
		}
	}
	return len(closed), nil
}

// SchedulePunctuation asks the host to call the processor's Punctuate
// whenever the task's stream time reaches a multiple of every (and once at
// the task's first record). Only Init may call it (an error anywhere else);
// 0 cancels.
func SchedulePunctuation(every time.Duration) error {
	result := onceflow_processor_context.SchedulePunctuation(uint64(durationMs(every)))
	if result.IsErr() {
		return &Error{Message: result.Err()}
	}
	return nil
}

// EscapeASCII is Rust's `<[u8]>::escape_ascii`, for messages identical to
// the Rust SDK's.
func EscapeASCII(bytes []byte) string {
	out := make([]byte, 0, len(bytes))
	for _, b := range bytes {
		switch {
		case b == '\t':
			out = append(out, '\\', 't')
		case b == '\n':
			out = append(out, '\\', 'n')
		case b == '\r':
			out = append(out, '\\', 'r')
		case b == '"' || b == '\'' || b == '\\':
			out = append(out, '\\', b)
		case b >= 0x20 && b < 0x7f:
			out = append(out, b)
		default:
			out = append(out, fmt.Sprintf("\\x%02x", b)...)
		}
	}
	return string(out)
}

// Init runs the registered processor's Init, if it has one (called by the
// generated export).
func Init(pairs []witTypes.Tuple2[string, string]) witTypes.Result[witTypes.Unit, string] {
	config = make(map[string]string, len(pairs))
	for _, pair := range pairs {
		config[pair.F0] = pair.F1
	}
	if initializer, ok := registered.(Initializer); ok {
		if err := initializer.Init(config); err != nil {
			return witTypes.Err[witTypes.Unit, string](err.Error())
		}
	}
	return witTypes.Ok[witTypes.Unit, string](witTypes.Unit{})
}

// ProcessBatch runs the registered processor on every record of a batch
// (called by the generated export).
func ProcessBatch(batch []onceflow_processor_types.Record) witTypes.Result[witTypes.Unit, onceflow_processor_types.ProcessError] {
	if registered == nil {
		return failure(0, "processor error: no processor registered: call onceflow.Register in an init function")
	}
	ctx := &Context{inRecord: true}
	for index := range batch {
		collectGarbage()
		onceflow_processor_context.BeginRecord(uint32(index))
		ctx.index = uint32(index)
		r := &batch[index]
		record := Record{
			Topic:     r.Topic,
			Partition: r.Partition,
			Offset:    r.Offset,
			Timestamp: r.Timestamp,
			Key:       present(r.Key),
			Value:     present(r.Value),
		}
		for _, h := range r.Headers {
			record.Headers = append(record.Headers, Header{Key: h.Key, Value: h.Value})
		}
		if message, failed := processOne(ctx, &record); failed {
			return failure(uint32(index), message)
		}
	}
	// The batch's own memory is garbage once this call returns: collect
	// now, while imports are allowed, if it was large.
	collectGarbage()
	return witTypes.Ok[witTypes.Unit, onceflow_processor_types.ProcessError](witTypes.Unit{})
}

// present is the option's bytes, nil for none and non-nil (if empty) for
// some: the bindings give a nil slice for an empty list.
func present(o witTypes.Option[[]uint8]) []byte {
	if o.IsNone() {
		return nil
	}
	if bytes := o.Some(); bytes != nil {
		return bytes
	}
	return []byte{}
}

// processOne runs Process, turning a panic into a logged failure.
func processOne(ctx *Context, record *Record) (message string, failed bool) {
	return guarded(func() error { return registered.Process(ctx, record) })
}

// guarded runs call, turning a panic into a logged failure.
func guarded(call func() error) (message string, failed bool) {
	defer func() {
		if recovered := recover(); recovered != nil {
			message = fmt.Sprintf("processor error: %v", recovered)
			onceflow_processor_log.Write(Fail, message+"\n"+string(debug.Stack()))
			failed = true
		}
	}()
	if err := call(); err != nil {
		return err.Error(), true
	}
	return "", false
}

// Punctuate runs the registered processor's Punctuate, if it has one
// (called by the generated export).
func Punctuate(streamTime int64) witTypes.Result[witTypes.Unit, onceflow_processor_types.ProcessError] {
	punctuator, ok := registered.(Punctuator)
	if !ok {
		return witTypes.Ok[witTypes.Unit, onceflow_processor_types.ProcessError](witTypes.Unit{})
	}
	collectGarbage()
	message, failed := guarded(func() error { return punctuator.Punctuate(&Context{}, streamTime) })
	collectGarbage()
	if failed {
		return witTypes.Err[witTypes.Unit](onceflow_processor_types.ProcessError{
			RecordIndex: witTypes.None[uint32](),
			Message:     message,
		})
	}
	return witTypes.Ok[witTypes.Unit, onceflow_processor_types.ProcessError](witTypes.Unit{})
}

func failure(index uint32, message string) witTypes.Result[witTypes.Unit, onceflow_processor_types.ProcessError] {
	return witTypes.Err[witTypes.Unit](onceflow_processor_types.ProcessError{
		RecordIndex: witTypes.Some[uint32](index),
		Message:     message,
	})
}
