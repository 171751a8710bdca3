package resp

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Replies holds the replies of one pipeline as a flat tree: every value
// is a node, an array's elements follow it, and its strings are slices of
// one buffer. Read back in place, a pipeline of a thousand commands costs
// a few allocations instead of go-redis's objects per reply and per
// element (BENCHMARKS.md, issue 14). It is reused pipeline after
// pipeline: a reply is valid until the next one is read into it. The
// zero value is empty and ready to use.
type Replies struct {
	nodes []rnode
	buf   []byte
	roots []int32 // the first node of each command's reply
	errs  []error // why the unanswered commands (kindUnanswered) have no reply
}

type rnode struct {
	kind byte  // kindNil, kindErr, …
	next int32 // the node after this one and its elements
	// off and end are a string's, an error's or a double's text in buf;
	// together (num) an integer's value, an array's number of elements (a
	// map's, twice its pairs) or an unanswered command's error in errs.
	// 16 bytes a node: a scrape's replies are tens of thousands of them.
	off, end int32
}

func (n *rnode) num() int64 { return int64(n.off)<<32 | int64(uint32(n.end)) }

func (n *rnode) setNum(v int64) { n.off, n.end = int32(v>>32), int32(v) }

func unansweredNode(err, next int) rnode {
	n := rnode{kind: kindUnanswered, next: int32(next)}
	n.setNum(int64(err))
	return n
}

// nilNode is what an absent reply reads as; never written.
var nilNode = rnode{kind: kindNil}

const (
	kindNil        byte = iota
	kindErr             // an error reply: the text
	kindInt             // an integer (a RESP3 boolean is 0 or 1)
	kindStr             // a simple, bulk or verbatim string, or a big number's digits
	kindDouble          // a RESP3 double: the text
	kindArr             // an array, set or push: n elements; a map: its keys and values in turn
	kindUnanswered      // no reply came: errs[n] says why
)

// NewReplies returns empty replies with room for nodes values and buf
// bytes of text: a caller that knows how large the last pipeline's grew
// (Size) starts there instead of growing to it by doubling.
func NewReplies(nodes, buf int) *Replies {
	return &Replies{nodes: make([]rnode, 0, nodes), buf: make([]byte, 0, buf)}
}

// Size is how many values and bytes of text the replies hold now.
func (r *Replies) Size() (nodes, buf int) { return len(r.nodes), len(r.buf) }

// Append appends v, a value as go-redis decodes it (nil, string, []byte,
// int64, bool, float64, an error reply, []any, map[any]any,
// map[string]string), as the reply of the next command.
func (r *Replies) Append(v any) {
	r.roots = append(r.roots, int32(len(r.nodes)))
	r.add(v, 0)
}

func (r *Replies) reset() {
	r.nodes, r.buf, r.roots = r.nodes[:0], r.buf[:0], r.roots[:0]
	clear(r.errs)
	r.errs = r.errs[:0]
}

// failFrom gives the commands from the nth to the total-th no reply,
// because of err.
func (r *Replies) failFrom(n, total int, err error) {
	r.roots = r.roots[:n]
	r.errs = append(r.errs, err)
	for range total - n {
		r.roots = append(r.roots, int32(len(r.nodes)))
		r.nodes = append(r.nodes, unansweredNode(len(r.errs)-1, len(r.nodes)+1))
	}
}

// copyReply appends v, a reply of other replies, as the next command's.
func (r *Replies) copyReply(v Reply) {
	r.roots = append(r.roots, int32(len(r.nodes)))
	if v.i < 0 {
		r.failFrom(len(r.roots)-1, len(r.roots), v.Err())
		return
	}
	end := v.r.nodes[v.i].next
	shift := int32(len(r.nodes)) - v.i
	for _, n := range v.r.nodes[v.i:end] {
		switch n.kind {
		case kindErr, kindStr, kindDouble:
			setText(r, &n, v.r.buf[n.off:n.end])
		case kindUnanswered:
			r.errs = append(r.errs, v.r.errs[n.num()])
			n.setNum(int64(len(r.errs) - 1))
		}
		n.next += shift
		r.nodes = append(r.nodes, n)
	}
}

// Reply is one command's reply, or one element of it, read in place: valid
// until its Replies are reused. The zero value is a nil reply.
type Reply struct {
	r *Replies
	i int32 // its node; unanswered or absent
}

const (
	unanswered int32 = -1 // a command not sent
	absent     int32 = -2 // no such element or field: a nil reply
)

// Ref names a command queued on a pipe (Pipe.Do); its reply comes once
// the pipe has run. A negative Ref (NoRef) names no command: its reply is
// unanswered (ErrNoReply).
type Ref int32

// NoRef is a command not queued.
const NoRef Ref = -1

// ErrNoReply is why a command has no reply when nothing else says.
var ErrNoReply = errors.New("no reply")

func (r *Replies) reply(c Ref) Reply {
	if c < 0 || int(c) >= len(r.roots) {
		return Reply{r, unanswered}
	}
	return Reply{r, r.roots[c]}
}

// respError is an error reply, as redis.Error: callers tell it from a
// failed read with errors.As(err, &redis.Error).
type respError string

func (e respError) Error() string { return string(e) }

func (respError) RedisError() {}

var _ redis.Error = respError("")

// Err returns the reply's error: an error reply (a redis.Error), or why
// it has none (the connection's or the context's error, ErrNoReply). A nil
// reply is not an error.
func (v Reply) Err() error {
	if v.i == unanswered {
		return ErrNoReply
	}
	if v.i < 0 || v.r == nil {
		return nil
	}
	switch n := &v.r.nodes[v.i]; n.kind {
	case kindErr:
		return respError(v.r.buf[n.off:n.end])
	case kindUnanswered:
		return v.r.errs[n.num()]
	}
	return nil
}

func (v Reply) node() *rnode {
	if v.i < 0 || v.r == nil {
		return &nilNode
	}
	return &v.r.nodes[v.i]
}

// IsNil reports a nil reply (RESP2's null bulk string or array, RESP3's
// null), an absent element or field, and the zero Reply.
func (v Reply) IsNil() bool { return v.node().kind == kindNil }

// Int returns an integer reply's value.
func (v Reply) Int() (int64, bool) {
	if n := v.node(); n.kind == kindInt {
		return n.num(), true
	}
	return 0, false
}

// Bytes returns a string reply's bytes, valid until the replies are
// reused; nil for any other kind.
func (v Reply) Bytes() []byte {
	n := v.node()
	if n.kind != kindStr {
		return nil
	}
	return v.r.buf[n.off:n.end:n.end]
}

// Str returns a string reply as a string, ok false for another kind.
func (v Reply) Str() (string, bool) {
	n := v.node()
	if n.kind != kindStr {
		return "", false
	}
	return string(v.r.buf[n.off:n.end]), true
}

// Float reads a number: a double, an integer, or a string holding one
// (RESP2 sends scores as strings).
func (v Reply) Float() (float64, bool) {
	n := v.node()
	switch n.kind {
	case kindInt:
		return float64(n.num()), true
	case kindStr, kindDouble:
		f, err := strconv.ParseFloat(string(v.r.buf[n.off:n.end]), 64)
		return f, err == nil
	}
	return 0, false
}

// Len is an array's number of elements (a map's keys and values), -1 for
// any other kind.
func (v Reply) Len() int {
	if n := v.node(); n.kind == kindArr {
		return int(n.num())
	}
	return -1
}

// Elems calls f with each element of an array, until f returns false.
func (v Reply) Elems(f func(Reply) bool) {
	n := v.node()
	if n.kind != kindArr {
		return
	}
	for i, e := 0, v.i+1; i < int(n.num()); i, e = i+1, v.r.nodes[e].next {
		if !f(Reply{v.r, e}) {
			return
		}
	}
}

// Next is the element after v in its array (whatever v's own elements);
// past the last one it reads the next reply: check the array's Len.
func (v Reply) Next() Reply {
	if v.i < 0 || v.r == nil {
		return Reply{v.r, absent}
	}
	return Reply{v.r, v.r.nodes[v.i].next}
}

// First is an array's first element; a nil reply when it has none.
func (v Reply) First() Reply {
	if v.Len() <= 0 {
		return Reply{v.r, absent}
	}
	return Reply{v.r, v.i + 1}
}

// Field returns the value after the string name in a map, or in an array
// of names and values (RESP2's maps); a nil reply when there is none.
func (v Reply) Field(name string) Reply {
	n := v.Len()
	if n%2 != 0 {
		return Reply{v.r, absent}
	}
	nodes := v.r.nodes
	for i, k := 0, v.i+1; i < n; i += 2 {
		val := nodes[k].next
		if kn := &nodes[k]; kn.kind == kindStr && string(v.r.buf[kn.off:kn.end]) == name {
			return Reply{v.r, val}
		}
		k = nodes[val].next
	}
	return Reply{v.r, absent}
}

// Pairs calls f with each name and value of a map, or of an array of
// names and values.
func (v Reply) Pairs(f func(k, v Reply)) {
	n := v.Len()
	if n%2 != 0 {
		return
	}
	nodes := v.r.nodes
	for i, k := 0, v.i+1; i < n; i += 2 {
		val := nodes[k].next
		f(Reply{v.r, k}, Reply{v.r, val})
		k = nodes[val].next
	}
}

// String renders a reply for error messages.
func (v Reply) String() string {
	var b bytes.Buffer
	v.render(&b)
	return b.String()
}

func (v Reply) render(b *bytes.Buffer) {
	n := v.node()
	switch n.kind {
	case kindNil:
		b.WriteString("<nil>")
	case kindInt:
		b.WriteString(strconv.FormatInt(n.num(), 10))
	case kindArr:
		b.WriteByte('[')
		sep := ""
		v.Elems(func(e Reply) bool {
			b.WriteString(sep)
			e.render(b)
			sep = " "
			return b.Len() < 400
		})
		b.WriteByte(']')
	case kindUnanswered:
		b.WriteString("<no reply>")
	default: // a string, an error, a double
		b.Write(v.r.buf[n.off:n.end])
	}
}

// errBadReply is a reply that does not follow RESP.
var errBadReply = errors.New("malformed RESP reply")

// maxDepth bounds the nesting of a reply (XINFO STREAM's is 4).
const maxDepth = 16

// setText appends t to r's buffer as nd's text.
func setText[T string | []byte](r *Replies, nd *rnode, t T) {
	nd.off = int32(len(r.buf))
	r.buf = append(r.buf, t...)
	nd.end = int32(len(r.buf))
}

// add appends a value go-redis decoded (the client transport) as nodes.
func (r *Replies) add(v any, depth int) {
	i := int32(len(r.nodes))
	r.nodes = append(r.nodes, rnode{})
	nd := rnode{}
	text := func(s string) { setText(r, &nd, s) }
	switch x := v.(type) {
	case nil:
	case string:
		nd.kind = kindStr
		text(x)
	case []byte:
		nd.kind = kindStr
		text(string(x))
	case int64:
		nd.kind = kindInt
		nd.setNum(x)
	case bool:
		nd.kind = kindInt
		if x {
			nd.setNum(1)
		}
	case float64:
		nd.kind = kindDouble
		text(strconv.FormatFloat(x, 'g', -1, 64))
	case error:
		nd.kind = kindErr
		text(x.Error())
	case []any:
		nd.kind = kindArr
		nd.setNum(int64(len(x)))
		if depth < maxDepth {
			for _, e := range x {
				r.add(e, depth+1)
			}
		}
	case map[any]any:
		nd.kind = kindArr
		nd.setNum(2 * int64(len(x)))
		if depth < maxDepth {
			for k, e := range x {
				r.add(k, depth+1)
				r.add(e, depth+1)
			}
		}
	case map[string]string: // HGETALL through go-redis's own command
		nd.kind = kindArr
		nd.setNum(2 * int64(len(x)))
		for k, e := range x {
			r.add(k, depth+1)
			r.add(e, depth+1)
		}
	default:
		nd.kind = kindStr
		text(fmt.Sprint(x))
	}
	if nd.kind == kindArr && depth >= maxDepth {
		nd.kind = kindErr
		text(errBadReply.Error() + ": nested too deep")
	}
	nd.next = int32(len(r.nodes))
	r.nodes[i] = nd
}
