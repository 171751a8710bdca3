package host

import _ "embed"

// backstopWasm is the module built from ../wasm by `make wasm`. Embedding it
// means a `go get` of this package brings everything a service needs.
//
//go:embed backstop.wasm
var backstopWasm []byte
