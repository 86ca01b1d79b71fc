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
package onceflow

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"

	witTypes "go.bytecodealliance.org/pkg/wit/types"
	"wit_component/onceflow_processor_context"
	"wit_component/onceflow_processor_log"
	"wit_component/onceflow_processor_output"
	"wit_component/onceflow_processor_state"
	"wit_component/onceflow_processor_types"
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
// [config] table once per instance.
type Initializer interface {
	Init(config map[string]string) error
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

// Context is what a processor may do while processing a record.
type Context struct{}

// Store is a state store declared in the manifest's `stores`.
func (*Context) Store(name string) Store { return Store{name: name} }

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
	switch e.Tag() {
	case onceflow_processor_types.StateError_UnknownStore:
		// %s with explicit quotes: the Rust SDK does not escape the name.
		return Errorf("unknown state store \"%s\": declare it under stores in onceflow.toml", e.UnknownStore())
	default:
		return Errorf("state key or value too large: the host accepts at most %d bytes", e.TooLarge())
	}
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
	// Rust's i64::from_str: an optional sign and ASCII digits, nothing else.
	text := string(value)
	digits := text
	if len(digits) > 0 && (digits[0] == '+' || digits[0] == '-') {
		digits = digits[1:]
	}
	allDigits := len(digits) > 0
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			allDigits = false
		}
	}
	if allDigits {
		if n, err := strconv.ParseInt(text, 10, 64); err == nil {
			return n, true, nil
		}
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
	ctx := &Context{}
	for index := range batch {
		collectGarbage()
		onceflow_processor_context.BeginRecord(uint32(index))
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
	defer func() {
		if recovered := recover(); recovered != nil {
			message = fmt.Sprintf("processor error: %v", recovered)
			onceflow_processor_log.Write(Fail, message+"\n"+string(debug.Stack()))
			failed = true
		}
	}()
	if err := registered.Process(ctx, record); err != nil {
		return err.Error(), true
	}
	return "", false
}

func failure(index uint32, message string) witTypes.Result[witTypes.Unit, onceflow_processor_types.ProcessError] {
	return witTypes.Err[witTypes.Unit](onceflow_processor_types.ProcessError{
		RecordIndex: witTypes.Some[uint32](index),
		Message:     message,
	})
}
