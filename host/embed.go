package host

import "github.com/backstop-dev/backstop/contract"

// backstopWasm is the module built from ../wasm by `make wasm`, embedded by
// the contract package: a `go get` of this package brings everything a
// service needs.
var backstopWasm = contract.Module
