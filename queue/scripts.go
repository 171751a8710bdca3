package queue

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

// Scripts holds the Lua scripts of the queue contract, the single source
// every language loads (see README.md beside them for KEYS, ARGV and
// replies).
//
//go:embed scripts/*.lua
var Scripts embed.FS

func mustScript(name string) *redis.Script {
	src, err := Scripts.ReadFile("scripts/" + name + ".lua")
	if err != nil {
		panic(err)
	}
	// Run uses EVALSHA and falls back to EVAL (which caches the script) on
	// NOSCRIPT; on a cluster it goes to the node owning the first key.
	return redis.NewScript(string(src))
}

var (
	scriptEnqueue    = mustScript("enqueue")
	scriptAck        = mustScript("ack")
	scriptRetry      = mustScript("retry")
	scriptDeadLetter = mustScript("dead_letter")
	scriptPromote    = mustScript("promote")
	scriptReclaim    = mustScript("reclaim")
	scriptReplay     = mustScript("replay")
	scriptHold       = mustScript("hold")
)
