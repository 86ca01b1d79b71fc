// The wasi-probe test guest (see ../wasi-probe) in Go. Go's wasip1 runtime
// imports WASI preview1, which `onceflow build` adapts to WASI 0.2
// (wasi:filesystem among others; no wasi:sockets: preview1 cannot open a
// connection, so `tcp`, `udp` and `dns` must fail in Go's own net package).
// The record's value names the probe, its key carries the port for `tcp`;
// the result is emitted to alias `out`.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"wit_component/onceflow"
)

type probe struct{}

func init() { onceflow.Register(probe{}) }

func (probe) Process(ctx *onceflow.Context, record *onceflow.Record) error {
	name := string(record.Value)
	if strings.HasPrefix(name, "{") || name == "not json" {
		// The SDK's JSON reader (docs/languages.md), not a probe of WASI.
		var v map[string]any
		result := ""
		if err := record.ValueJSON(&v); err != nil {
			result = "error: " + err.Error()
		} else if b, err := json.Marshal(v); err != nil {
			result = "error: " + err.Error()
		} else {
			result = string(b)
		}
		return ctx.Emit("out", []byte("json"), []byte(result))
	}
	return ctx.Emit("out", []byte(name), []byte(run(name, string(record.Key))))
}

func run(name, key string) string {
	switch name {
	case "tcp":
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+key, time.Second)
		if err != nil {
			return "error: connect to 127.0.0.1:" + key + ": " + err.Error()
		}
		defer conn.Close()
		return "connected from " + conn.LocalAddr().String()
	case "udp":
		conn, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return "error: udp: " + err.Error()
		}
		defer conn.Close()
		return "bound " + conn.LocalAddr().String()
	case "dns":
		addresses, err := net.LookupHost("localhost")
		if err != nil {
			return "error: resolve localhost: " + err.Error()
		}
		return "resolved localhost to " + strings.Join(addresses, ", ")
	case "file":
		bytes, err := os.ReadFile("/etc/passwd")
		if err != nil {
			return "error: read /etc/passwd: " + err.Error()
		}
		return fmt.Sprintf("read %d bytes from /etc/passwd", len(bytes))
	case "dir":
		return "/: " + list("/") + "; .: " + list(".")
	case "env":
		return fmt.Sprintf("env=%d args=%d", len(os.Environ()), len(os.Args))
	case "clock":
		return fmt.Sprint(time.Now().UnixMilli())
	case "random":
		bytes := make([]byte, 16)
		if _, err := rand.Read(bytes); err != nil {
			return "error: " + err.Error()
		}
		return hex.EncodeToString(bytes)
	case "stdout":
		fmt.Println("probe stdout line")
		fmt.Fprintln(os.Stderr, "probe stderr line")
		return "printed"
	}
	return "unknown probe"
}

func list(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "error: " + err.Error()
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return fmt.Sprintf("%d entries [%s]", len(names), strings.Join(names, ", "))
}
