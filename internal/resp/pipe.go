package resp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/backstop-dev/backstop/internal/ctxtime"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/auth"
)

// A Pipe queues the read commands of one pipeline and runs them through
// its transport; the replies are read in place (Replies). The zero value
// has no transport: give it one with Bind before Exec.
type Pipe struct {
	t    Transport
	args []string // every command's arguments, one after the other
	argc []int    // each command's number of arguments
	// rep holds the replies once read; pipes read one after the other
	// may share one (a scrape's batches do).
	rep *Replies
}

// NewPipe returns a pipe that runs over t and reads its replies into r;
// a nil r is made on first use.
func NewPipe(t Transport, r *Replies) *Pipe { return &Pipe{t: t, rep: r} }

// Bind sets the transport p runs over and the replies it reads into (nil:
// its own, made on first use), for a pipe held by value.
func (p *Pipe) Bind(t Transport, r *Replies) { p.t, p.rep = t, r }

// Do queues a command and names its reply.
func (p *Pipe) Do(args ...string) Ref {
	p.args = append(p.args, args...)
	p.argc = append(p.argc, len(args))
	return Ref(len(p.argc) - 1)
}

// Len is the number of commands queued.
func (p *Pipe) Len() int { return len(p.argc) }

// Reply is a command's reply once the pipe has run: valid until the next
// pipe is read into the same replies.
func (p *Pipe) Reply(c Ref) Reply { return p.arena().reply(c) }

// arena returns the replies, made on first use.
func (p *Pipe) arena() *Replies {
	if p.rep == nil {
		p.rep = &Replies{}
	}
	return p.rep
}

// Exec runs the queued commands, or gives up when ctx ends (abandoned:
// the transport's goroutine may still write the replies, which must not
// be read then). Errors are the replies': an unanswered command's reply
// says why (Reply.Err).
func (p *Pipe) Exec(ctx context.Context) (abandoned bool) {
	sent := false
	abandoned = p.t.Stream(ctx, func() *Pipe {
		if sent {
			return nil
		}
		sent = true
		return p
	}, func(*Pipe) bool { return true }) != nil
	if r := p.arena(); !abandoned && len(r.roots) < p.Len() {
		err := ctx.Err() // not sent: the budget ran out first
		if err == nil {
			err = ErrNoReply
		}
		r.failFrom(len(r.roots), p.Len(), err)
	}
	return abandoned
}

// Clear forgets the commands, keeping the memory.
func (p *Pipe) Clear() {
	p.args, p.argc = p.args[:0], p.argc[:0]
}

// command returns the arguments of the ith command from offset off,
// and the next command's offset.
func (p *Pipe) command(i, off int) ([]string, int) {
	end := off + p.argc[i]
	return p.args[off:end], end
}

// A Transport runs the pipes next returns, in order, and calls done with
// each once its replies are in, until next returns nil or done false.
// Where it can it sends the next pipe before reading the last one's
// replies, so that Redis answers one batch while the caller reads the
// one before. It returns the pipe it gave up on when ctx ended before its
// replies came (over a client that ignores deadlines), else nil. The
// pipes it was not given a chance to send (ctx ended first) are left
// without replies: the caller reports them.
type Transport interface {
	Stream(ctx context.Context, next func() *Pipe, done func(*Pipe) bool) (abandoned *Pipe)
	// Close closes the transport's own connections, if it has any; a
	// Stream after Close dials anew. It never closes the client.
	Close() error
}

// NewTransport picks how to read through rdb: connections of its own,
// dialled and logged in as the client's options say, for a plain or
// Sentinel-managed client (ConnTransport) and for a cluster, one per
// master (ClusterTransport); or the client's own pipelines
// (ClientTransport) for a client that runs code on connect or takes
// streaming credentials, and any other client.
func NewTransport(rdb redis.UniversalClient) Transport {
	switch c := rdb.(type) {
	case *redis.Client:
		if opt := c.Options(); ownable(opt.OnConnect, opt.StreamingCredentialsProvider) && opt.Dialer != nil {
			return newConnTransport(opt)
		}
	case *redis.ClusterClient:
		if opt := c.Options(); ownable(opt.OnConnect, opt.StreamingCredentialsProvider) {
			return &ClusterTransport{rdb: c, nodes: map[string]*ConnTransport{}}
		}
	}
	return NewClientTransport(rdb)
}

// NewClientTransport reads through rdb's own pipelines, so that its hooks
// (tracing, metrics) see every command.
func NewClientTransport(rdb redis.UniversalClient) *ClientTransport {
	return &ClientTransport{rdb: rdb}
}

// ownable says whether a transport can log in on its own connection as
// the client would: not when the client runs code on connect or takes
// streaming credentials.
func ownable(onConnect func(context.Context, *redis.Conn) error, streaming auth.StreamingCredentialsProvider) bool {
	return onConnect == nil && streaming == nil
}

// ClientTransport sends the commands through go-redis's pipelines, one
// pipe after the other.
type ClientTransport struct {
	rdb redis.UniversalClient
}

// Stream runs each pipe through a go-redis pipeline of its own.
func (t *ClientTransport) Stream(ctx context.Context, next func() *Pipe, done func(*Pipe) bool) *Pipe {
	for p := next(); p != nil; p = next() {
		p.arena().reset()
		// In a goroutine of its own, so the budget holds even over a
		// client that ignores context deadlines.
		if !ctxtime.Within(ctx, func() { t.exec(ctx, p) }) {
			return p
		}
		if !done(p) {
			return nil
		}
	}
	return nil
}

func (t *ClientTransport) exec(ctx context.Context, p *Pipe) {
	rp := t.rdb.Pipeline()
	cmds := make([]*redis.Cmd, 0, p.Len())
	for i, off := 0, 0; i < p.Len(); i++ {
		var args []string
		args, off = p.command(i, off)
		cmds = append(cmds, rp.Do(ctx, anyArgs(args)...))
	}
	done, err := rp.Exec(ctx)
	StampUnanswered(done, err)
	for _, c := range cmds {
		v, err := c.Result()
		var rerr redis.Error
		switch {
		case errors.Is(err, redis.Nil):
			v = nil
		case errors.As(err, &rerr):
			v = err
		case err != nil: // not a reply: the command was not answered
			p.rep.failFrom(len(p.rep.roots), len(cmds), err)
			return
		}
		p.rep.Append(v)
	}
}

// Close does nothing: the connections are the client's.
func (t *ClientTransport) Close() error { return nil }

// anyArgs is a command's arguments as go-redis's Do takes them.
func anyArgs(args []string) []any {
	a := make([]any, len(args))
	for i, s := range args {
		a[i] = s
	}
	return a
}

// StampUnanswered gives every command of a go-redis pipeline the
// pipeline's error when none carries one: go-redis returns an error reply
// met while opening the connection (WRONGPASS, NOAUTH) without setting it
// on the commands, which would then look answered with empty values.
func StampUnanswered(cmds []redis.Cmder, err error) {
	if err == nil {
		return
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return
		}
	}
	for _, c := range cmds {
		c.SetErr(err)
	}
}

// ConnTransport reads over one connection of its own, dialled and logged
// in as the client's options say (TLS, user and password or credentials
// provider, database; through the Sentinels for a failover client), and
// kept between streams (a failover client's is dialled anew for each). It
// speaks RESP2, which every server takes, and reads RESP3 too. Every pipe
// it runs has the deadline of its context (a scrape's budget): past it
// reads and writes fail. A connection that fails is closed, and the pipes
// after the failure fail with it: the next Stream dials anew.
type ConnTransport struct {
	opt *redis.Options
	// turn is held by the one stream at a time (replies come in the
	// order sent); a stream whose budget ends while it waits gives up.
	turn chan struct{}
	nc   net.Conn
	rd   *bufio.Reader
	out  []byte
	// The stream's state: the pipes sent whose replies are not read yet,
	// the error that broke the connection, and whether the connection
	// was kept from an earlier stream (and may have been closed by the
	// server since).
	pending []*Pipe
	err     error
	kept    bool
}

// Stream runs the pipes over the connection, up to PipelineDepth of them
// on the wire.
func (t *ConnTransport) Stream(ctx context.Context, next func() *Pipe, done func(*Pipe) bool) *Pipe {
	if !t.lock(ctx) {
		return nil // nothing sent: the caller reports the budget
	}
	defer t.unlock()
	if t.opt.Addr == failoverAddr {
		// Through Sentinel: dial the master go-redis knows now (its
		// subscription to the Sentinels keeps it current), not the one
		// of the last stream, which may have been failed over since.
		t.drop()
	}
	t.pending, t.err, t.kept = t.pending[:0], nil, t.nc != nil
	defer func() {
		if t.err != nil || len(t.pending) > 0 {
			t.drop()
		}
		clear(t.pending)
	}()
	fill := func() {
		for len(t.pending) < PipelineDepth && t.err == nil && ctx.Err() == nil {
			p := next()
			if p == nil {
				return
			}
			t.start(ctx, p)
		}
	}
	fill()
	for len(t.pending) > 0 {
		p := t.pending[0]
		t.finish(ctx, p)
		if !done(p) || ctx.Err() != nil {
			for len(t.pending) > 0 {
				t.finish(ctx, t.pending[0]) // read, so the connection stays in step
			}
			return nil
		}
		if t.err != nil && len(t.pending) == 0 {
			// The connection broke: the batches left try a new one.
			t.drop()
			t.err = nil
		}
		fill()
	}
	return nil
}

// PipelineDepth is how many pipes a connection has on the wire at most:
// Redis answers the next ones while the caller reads the first, and a
// scheduler that is slow to run either (a busy machine) stalls the scrape
// less often.
const PipelineDepth = 4

// start sends p after the pipes pending; finish reads its replies.
func (t *ConnTransport) start(ctx context.Context, p *Pipe) {
	t.pending = append(t.pending, p)
	if t.err == nil {
		t.err = t.write(ctx, p)
	}
}

// finish reads the replies of the oldest pipe pending, p. A kept
// connection that fails before its first reply is dialled anew and the
// pipes pending sent again: the server may have closed it since the last
// stream (a restart, an idle timeout), and reads are safe to send twice.
func (t *ConnTransport) finish(ctx context.Context, p *Pipe) {
	t.pending = t.pending[1:]
	p.arena().reset()
	if t.err == nil {
		t.err = t.readReplies(ctx, p)
	}
	if t.err != nil && t.kept && len(p.rep.roots) == 0 && ctx.Err() == nil {
		t.drop()
		t.err = nil
		p.rep.reset()
		for _, q := range append([]*Pipe{p}, t.pending...) {
			if t.err == nil {
				t.err = t.write(ctx, q)
			}
		}
		if t.err == nil {
			t.err = t.readReplies(ctx, p)
		}
	}
	t.kept = false
	if t.err != nil {
		p.rep.failFrom(len(p.rep.roots), p.Len(), t.err)
	}
}

func (t *ConnTransport) write(ctx context.Context, p *Pipe) error {
	if t.nc == nil {
		if err := t.dial(ctx); err != nil {
			return err
		}
	}
	deadline, _ := ctx.Deadline() // zero: none
	if err := t.nc.SetDeadline(deadline); err != nil {
		return err
	}
	t.out = t.out[:0]
	for i, off := 0, 0; i < p.Len(); i++ {
		var args []string
		args, off = p.command(i, off)
		t.out = appendCommand(t.out, args)
	}
	_, err := t.nc.Write(t.out)
	return ctxErr(ctx, err)
}

func (t *ConnTransport) readReplies(ctx context.Context, p *Pipe) error {
	r := p.arena()
	for range p.Len() {
		r.roots = append(r.roots, int32(len(r.nodes)))
		if err := r.read(t.rd, 0); err != nil {
			r.roots = r.roots[:len(r.roots)-1]
			return ctxErr(ctx, err)
		}
	}
	return nil
}

// ctxErr says a read or write failed because the budget (ctx) ran out.
func ctxErr(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

func (t *ConnTransport) dial(ctx context.Context) error {
	opt := t.opt
	nc, err := opt.Dialer(ctx, opt.Network, opt.Addr)
	if err != nil {
		return err
	}
	t.nc, t.rd = nc, bufio.NewReaderSize(nc, 64<<10)
	user, pass := opt.Username, opt.Password
	switch {
	case opt.CredentialsProviderContext != nil:
		if user, pass, err = opt.CredentialsProviderContext(ctx); err != nil {
			t.drop()
			return err
		}
	case opt.CredentialsProvider != nil:
		user, pass = opt.CredentialsProvider()
	}
	var hello Pipe
	switch {
	case user != "": // as go-redis's HELLO: a nopass user takes any password
		hello.Do("AUTH", user, pass)
	case pass != "":
		hello.Do("AUTH", pass)
	}
	if opt.DB != 0 {
		hello.Do("SELECT", strconv.Itoa(opt.DB))
	}
	needed := hello.Len() // the name is cosmetic: an ACL may refuse it
	if opt.ClientName != "" {
		hello.Do("CLIENT", "SETNAME", opt.ClientName)
	}
	if hello.Len() == 0 {
		return nil
	}
	err = t.write(ctx, &hello)
	if err == nil {
		err = t.readReplies(ctx, &hello)
	}
	for i := range needed {
		if err == nil {
			err = hello.Reply(Ref(i)).Err()
		}
	}
	if err != nil {
		t.drop()
	}
	return err
}

func (t *ConnTransport) drop() {
	if t.nc != nil {
		t.nc.Close()
		t.nc, t.rd = nil, nil
	}
}

// failoverAddr is the address go-redis gives a Sentinel-managed client
// (NewFailoverClient), whose dialer asks the Sentinels for the master.
const failoverAddr = "FailoverClient"

func newConnTransport(opt *redis.Options) *ConnTransport {
	return &ConnTransport{opt: opt, turn: make(chan struct{}, 1)}
}

func (t *ConnTransport) lock(ctx context.Context) bool {
	select {
	case t.turn <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (t *ConnTransport) unlock() { <-t.turn }

// Close closes the connection, once the stream running is done.
func (t *ConnTransport) Close() error {
	t.turn <- struct{}{}
	defer t.unlock()
	t.drop()
	return nil
}

// ClusterTransport reads a cluster over connections of its own, one per
// master (ConnTransport, with the master's options): each command goes to
// the master of its key's slot as go-redis sees the cluster
// (MasterForKey), the masters' pipelines run at once, and their replies
// are put back in the order sent. A MOVED or ASK reply (a slot moving to
// another master) is followed once, as go-redis does, and a MOVED makes
// go-redis reload its view of the cluster before the next pipe.
type ClusterTransport struct {
	rdb   *redis.ClusterClient
	mu    sync.Mutex
	nodes map[string]*ConnTransport // by address; a master gone is closed at the next reload
	moved bool                      // a reply said slots moved: reload before the next pipe
}

// Stream runs the pipes one after the other, each split per master.
func (t *ClusterTransport) Stream(ctx context.Context, next func() *Pipe, done func(*Pipe) bool) *Pipe {
	t.mu.Lock()
	defer t.mu.Unlock()
	for p := next(); p != nil && ctx.Err() == nil; p = next() {
		t.exec(ctx, p)
		if !done(p) {
			return nil
		}
	}
	return nil // the caller reports the pipes the budget left unsent
}

func (t *ClusterTransport) exec(ctx context.Context, p *Pipe) {
	p.arena().reset()
	if t.moved {
		t.moved = false
		t.rdb.ReloadState(ctx)
		t.prune(ctx)
	}
	type route struct {
		sub *Pipe
		c   Ref
		err error // the command's master is not known
	}
	routes := make([]route, p.Len())
	subs := map[*ConnTransport]*Pipe{}
	send := func(i int, node *ConnTransport, asking bool, args []string) {
		sub := subs[node]
		if sub == nil {
			sub = &Pipe{t: node}
			subs[node] = sub
		}
		if asking {
			sub.Do("ASKING") // its OK is not read
		}
		routes[i] = route{sub: sub, c: sub.Do(args...)}
	}
	run := func() {
		var wg sync.WaitGroup
		for _, sub := range subs {
			wg.Go(func() { sub.Exec(ctx) })
		}
		wg.Wait()
	}
	for i, off := 0, 0; i < p.Len(); i++ {
		var args []string
		args, off = p.command(i, off)
		node, err := t.node(ctx, commandKey(args))
		if err != nil {
			routes[i].err = err
			continue
		}
		send(i, node, false, args)
	}
	run()
	// Slots on the move: follow a MOVED or ASK once, as go-redis does, and
	// after a MOVED reload the slot map before the next pipe.
	first := routes
	routes, subs = make([]route, len(first)), map[*ConnTransport]*Pipe{}
	copy(routes, first)
	again := false
	for i, off := 0, 0; i < p.Len(); i++ {
		var args []string
		args, off = p.command(i, off)
		r := first[i]
		if r.err != nil {
			continue
		}
		addr, ask, ok := redirection(r.sub.Reply(r.c).Err())
		if !ok {
			continue
		}
		t.moved = t.moved || !ask
		send(i, t.nodeAt(addr, r.sub.t.(*ConnTransport).opt), ask, args)
		again = true
	}
	if again {
		run()
	}
	for _, r := range routes {
		if r.err != nil {
			p.rep.failFrom(len(p.rep.roots), len(p.rep.roots)+1, r.err)
			continue
		}
		p.rep.copyReply(r.sub.Reply(r.c))
	}
}

// redirection reads a MOVED or ASK error reply: the address it names and
// whether it is ASK.
func redirection(err error) (addr string, ask, ok bool) {
	var rerr respError
	if !errors.As(err, &rerr) {
		return "", false, false
	}
	kind, rest, _ := strings.Cut(string(rerr), " ")
	_, addr, found := strings.Cut(rest, " ")
	if !found || (kind != "MOVED" && kind != "ASK") {
		return "", false, false
	}
	return addr, kind == "ASK", true
}

// nodeAt is the connection to the master at addr, dialled with like's
// options (the cluster's: the same dialer, TLS and credentials) when it
// is new.
func (t *ClusterTransport) nodeAt(addr string, like *redis.Options) *ConnTransport {
	if node := t.nodes[addr]; node != nil {
		return node
	}
	opt := *like
	opt.Addr = addr
	node := newConnTransport(&opt)
	t.nodes[addr] = node
	return node
}

// commandKey is the key a read command names ("" for PING: any master).
func commandKey(args []string) string {
	switch {
	case len(args) > 2 && args[0] == "XINFO":
		return args[2]
	case len(args) > 1:
		return args[1]
	}
	return ""
}

func (t *ClusterTransport) node(ctx context.Context, key string) (*ConnTransport, error) {
	m, err := t.rdb.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	opt := m.Options()
	node := t.nodes[opt.Addr]
	if node == nil {
		node = newConnTransport(opt)
		t.nodes[opt.Addr] = node
	}
	return node, nil
}

// prune closes the connections to nodes that are no longer masters.
func (t *ClusterTransport) prune(ctx context.Context) {
	var mu sync.Mutex // ForEachMaster calls at once
	masters := map[string]bool{}
	t.rdb.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		mu.Lock()
		masters[m.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	for addr, node := range t.nodes {
		if !masters[addr] {
			node.Close()
			delete(t.nodes, addr)
		}
	}
}

// Close closes the connections to every master.
func (t *ClusterTransport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for addr, node := range t.nodes {
		node.Close()
		delete(t.nodes, addr)
	}
	return nil
}

// appendCommand writes a command as RESP: an array of bulk strings.
func appendCommand(b []byte, args []string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, '\r', '\n')
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

// read reads one reply (RESP2 or RESP3) into nodes.
func (r *Replies) read(rd *bufio.Reader, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: nested deeper than %d", errBadReply, maxDepth)
	}
	line, err := rd.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("%w: a line longer than %d bytes", errBadReply, rd.Size())
		}
		return err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return fmt.Errorf("%w: %q", errBadReply, line)
	}
	typ, body := line[0], line[1:len(line)-2]
	i := len(r.nodes)
	r.nodes = append(r.nodes, rnode{})
	nd := rnode{}
	text := func(b []byte) { setText(r, &nd, b) }
	switch typ {
	case '+':
		nd.kind = kindStr
		text(body)
	case '-', '!': // simple and bulk error
		nd.kind = kindErr
		if typ == '!' {
			if err := r.bulk(rd, body, &nd); err != nil {
				return err
			}
			break
		}
		text(body)
	case ':':
		nd.kind = kindInt
		v, err := parseInt(body)
		if err != nil {
			return err
		}
		nd.setNum(v)
	case '#':
		nd.kind = kindInt
		if len(body) == 1 && body[0] == 't' {
			nd.setNum(1)
		}
	case ',':
		nd.kind = kindDouble
		text(body)
	case '(':
		nd.kind = kindStr
		text(body)
	case '_':
	case '$', '=':
		n, err := parseInt(body)
		if err != nil {
			return err
		}
		if n == -1 { // RESP2's null bulk string
			break
		}
		nd.kind = kindStr
		if err := r.bulk(rd, body, &nd); err != nil {
			return err
		}
		if typ == '=' && nd.end-nd.off >= 4 { // verbatim: "txt:" before the text
			nd.off += 4
		}
	case '*', '~', '>', '%':
		n, err := parseInt(body)
		if err != nil {
			return err
		}
		if n == -1 { // RESP2's null array
			break
		}
		if n < 0 {
			return fmt.Errorf("%w: array length %d", errBadReply, n)
		}
		if typ == '%' {
			n *= 2
		}
		nd.kind = kindArr
		nd.setNum(n)
		for range n {
			if err := r.read(rd, depth+1); err != nil {
				return err
			}
		}
	case '|': // attributes precede the reply they describe: skip them
		n, err := parseInt(body)
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.read(rd, depth+1); err != nil {
				return err
			}
		}
		r.nodes = r.nodes[:i]
		return r.read(rd, depth)
	default:
		return fmt.Errorf("%w: type %q", errBadReply, typ)
	}
	nd.next = int32(len(r.nodes))
	r.nodes[i] = nd
	return nil
}

// bulk reads a bulk string whose length is the line's body.
func (r *Replies) bulk(rd *bufio.Reader, body []byte, nd *rnode) error {
	n, err := parseInt(body)
	if err != nil || n < 0 || n > 512<<20 {
		return fmt.Errorf("%w: bulk length %q", errBadReply, body)
	}
	off := len(r.buf)
	r.buf = append(r.buf, make([]byte, n+2)...)
	if _, err := io.ReadFull(rd, r.buf[off:]); err != nil {
		return err
	}
	if end := r.buf[off+int(n):]; end[0] != '\r' || end[1] != '\n' {
		return fmt.Errorf("%w: bulk string of %d bytes not followed by CRLF", errBadReply, n)
	}
	r.buf = r.buf[:off+int(n)]
	nd.off, nd.end = int32(off), int32(off+int(n))
	return nil
}

func parseInt(b []byte) (int64, error) {
	// Most numbers here are short counts: read their digits directly.
	if n := len(b); n > 0 && n < 19 {
		neg := b[0] == '-'
		v, i := int64(0), 0
		if neg {
			i = 1
		}
		for ; i < n && b[i] >= '0' && b[i] <= '9'; i++ {
			v = v*10 + int64(b[i]-'0')
		}
		if i == n && (!neg || n > 1) {
			if neg {
				v = -v
			}
			return v, nil
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: number %q", errBadReply, b)
	}
	return n, nil
}
