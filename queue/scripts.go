package queue

import (
	"embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Scripts holds the Lua scripts of the queue contract, the single source
// every language loads (see README.md beside them for KEYS, ARGV and
// replies), and lib.lua, the helpers they share: a prelude sent before each
// script, never run alone. ScriptSource builds the body a host sends.
//
//go:embed scripts/*.lua
var Scripts embed.FS

// ScriptSource returns the body of script name ("enqueue", "ack", ...) as
// every host sends it to Redis: scripts/lib.lua, a newline, then
// scripts/<name>.lua.
func ScriptSource(name string) (string, error) {
	if name == "lib" {
		return "", fmt.Errorf("queue: lib.lua is the scripts' prelude, not a script")
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

func mustScript(name string) *redis.Script {
	src, err := ScriptSource(name)
	if err != nil {
		panic(err)
	}
	// Run uses EVALSHA and falls back to EVAL (which caches the script) on
	// NOSCRIPT; on a cluster it goes to the node owning the first key.
	return redis.NewScript(src)
}

var (
	scriptEnqueue    = mustScript("enqueue")
	scriptAck        = mustScript("ack")
	scriptRetry      = mustScript("retry")
	scriptDefer      = mustScript("defer")
	scriptDeadLetter = mustScript("dead_letter")
	scriptPromote    = mustScript("promote")
	scriptReclaim    = mustScript("reclaim")
	scriptReplay     = mustScript("replay")
	scriptHold       = mustScript("hold")
	scriptRun        = mustScript("run")
)
