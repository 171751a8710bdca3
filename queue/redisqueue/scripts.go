package redisqueue

import (
	"github.com/redis/go-redis/v9"

	"github.com/backstop-dev/backstop/contract"
)

func mustScript(name string) *redis.Script {
	src, err := contract.ScriptSource(name)
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
