// Package resp is the exporter's Redis client for reads: pipelines of
// commands (Pipe) run over a Transport, whose replies are read in place
// into one flat arena (Replies, Reply) instead of go-redis's objects per
// reply and per element.
//
// A Transport is either connections of its own, dialled and logged in as
// a go-redis client's options say (ConnTransport; ClusterTransport, one
// per master of a cluster), which speak RESP2 and read RESP3 too, or the
// client's own pipelines (ClientTransport), whose decoded replies are
// copied into the same arena: the caller reads both alike.
//
//	t := resp.NewTransport(rdb)
//	defer t.Close()
//	p := resp.NewPipe(t, nil)
//	n := p.Do("XLEN", "orders")
//	if p.Exec(ctx) { … } // abandoned: ctx ended first
//	size, ok := p.Reply(n).Int() // p.Reply(n).Err() says why there is none
//
// Only read commands are meant to be sent: a connection that breaks
// before its first reply is dialled anew and its pipes sent again.
package resp
