// Package contract holds what every language of backstop shares, byte for
// byte: the policy module (backstop.wasm, built from ../wasm by `make
// wasm`), the Lua scripts of the Redis queue and idempotency contracts
// (scripts/; ../queue/redisqueue/README.md gives their KEYS, ARGV and replies),
// the PostgreSQL idempotency store's table and claim (scripts/idempotency.sql),
// and the table from language errors to error kinds (errorkinds.json). Go embeds
// them from here; `make wasm` and the Node and Python packages' build hooks
// copy them into those packages.
package contract

import (
	"embed"
	"fmt"
)

// Module is backstop.wasm. Embedding it means a `go get` of the Go host
// brings everything a service needs.
//
//go:embed backstop.wasm
var Module []byte

// Scripts holds the Lua scripts, and lib.lua, the helpers they share: a
// prelude sent before each script, never run alone. ScriptSource builds the
// body a host sends.
//
//go:embed scripts/*.lua
var Scripts embed.FS

// IdempotencySQL is scripts/idempotency.sql: the PostgreSQL idempotency
// store's table and the function that decides its claims, which every
// language's store runs (idempotency/pgstore.Schema writes it for a table).
//
//go:embed scripts/idempotency.sql
var IdempotencySQL string

// ErrorKinds is errorkinds.json: the one table from language errors to
// error kinds that every language follows.
//
//go:embed errorkinds.json
var ErrorKinds []byte

// ScriptSource returns the body of script name ("enqueue", "ack", ...) as
// every host sends it to Redis: scripts/lib.lua, a newline, then
// scripts/<name>.lua.
func ScriptSource(name string) (string, error) {
	if name == "lib" {
		return "", fmt.Errorf("contract: lib.lua is the scripts' prelude, not a script")
	}
	src, err := Scripts.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		return "", err
	}
	lib, err := Scripts.ReadFile("scripts/lib.lua")
	if err != nil {
		return "", err
	}
	return string(lib) + "\n" + string(src), nil
}
