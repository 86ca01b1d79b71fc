// Package export_wit_world implements the world's exports, as the bindings
// `wit-bindgen go` generates expect, by handing them to the onceflow SDK
// layer. Written into every Go build by `onceflow build`.
package export_wit_world

import (
	witTypes "go.bytecodealliance.org/pkg/wit/types"
	"wit_component/onceflow"
	"wit_component/onceflow_processor_types"
)

// Init is the world's `init` export.
func Init(config []witTypes.Tuple2[string, string]) witTypes.Result[witTypes.Unit, string] {
	return onceflow.Init(config)
}

// Process is the world's `process` export.
func Process(batch []onceflow_processor_types.Record) witTypes.Result[witTypes.Unit, onceflow_processor_types.ProcessError] {
	return onceflow.ProcessBatch(batch)
}

// Punctuate is the world's `punctuate` export.
func Punctuate(streamTime int64) witTypes.Result[witTypes.Unit, onceflow_processor_types.ProcessError] {
	return onceflow.Punctuate(streamTime)
}
