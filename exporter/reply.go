package exporter

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// replies holds the replies of one pipeline as a flat tree: every value
// is a node, an array's elements follow it, and its strings are slices of
// one buffer. Read back in place, a pipeline of a thousand commands costs
// a few allocations instead of go-redis's objects per reply and per
// element (BENCHMARKS.md, issue 14). It is reused pipeline after
// pipeline: a reply is valid until the next one is read into it.
type replies struct {
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

func (r *replies) reset() {
	r.nodes, r.buf, r.roots = r.nodes[:0], r.buf[:0], r.roots[:0]
	clear(r.errs)
	r.errs = r.errs[:0]
}

// failFrom gives the commands from the nth to the total-th no reply,
// because of err.
func (r *replies) failFrom(n, total int, err error) {
	r.roots = r.roots[:n]
	r.errs = append(r.errs, err)
	for range total - n {
		r.roots = append(r.roots, int32(len(r.nodes)))
		r.nodes = append(r.nodes, unansweredNode(len(r.errs)-1, len(r.nodes)+1))
	}
}

// copyReply appends v, a reply of other replies, as the next command's.
func (r *replies) copyReply(v reply) {
	r.roots = append(r.roots, int32(len(r.nodes)))
	if v.i < 0 {
		r.failFrom(len(r.roots)-1, len(r.roots), v.err())
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

// reply is one command's reply, or one element of it.
type reply struct {
	r *replies
	i int32 // its node; unanswered or absent
}

const (
	unanswered int32 = -1 // a command not sent
	absent     int32 = -2 // no such element or field: a nil reply
)

// ref names a command queued on a pipe; its reply comes once it has run.
type ref int32

func (r *replies) reply(c ref) reply {
	if c < 0 || int(c) >= len(r.roots) {
		return reply{r, unanswered}
	}
	return reply{r, r.roots[c]}
}

// respError is an error reply, as redis.Error: what kindOf and isMissing
// read.
type respError string

func (e respError) Error() string { return string(e) }

func (respError) RedisError() {}

var _ redis.Error = respError("")

// err returns the reply's error: an error reply, or why it has none. A
// nil reply is not an error.
func (v reply) err() error {
	if v.i == unanswered {
		return errNoReply
	}
	if v.i < 0 {
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

func (v reply) node() *rnode {
	if v.i < 0 {
		return &nilNode
	}
	return &v.r.nodes[v.i]
}

func (v reply) isNil() bool { return v.node().kind == kindNil }

// int returns an integer reply's value.
func (v reply) int() (int64, bool) {
	if n := v.node(); n.kind == kindInt {
		return n.num(), true
	}
	return 0, false
}

// bytes returns a string reply's bytes, valid until the replies are
// reused; nil for any other kind.
func (v reply) bytes() []byte {
	n := v.node()
	if n.kind != kindStr {
		return nil
	}
	return v.r.buf[n.off:n.end:n.end]
}

// str returns a string reply as a string, ok false for another kind.
func (v reply) str() (string, bool) {
	n := v.node()
	if n.kind != kindStr {
		return "", false
	}
	return string(v.r.buf[n.off:n.end]), true
}

// float reads a number: a double, an integer, or a string holding one
// (RESP2 sends scores as strings).
func (v reply) float() (float64, bool) {
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

// len is an array's number of elements (a map's keys and values), -1 for
// any other kind.
func (v reply) len() int {
	if n := v.node(); n.kind == kindArr {
		return int(n.num())
	}
	return -1
}

// elems calls f with each element of an array, until f returns false.
func (v reply) elems(f func(reply) bool) {
	n := v.node()
	if n.kind != kindArr {
		return
	}
	for i, e := 0, v.i+1; i < int(n.num()); i, e = i+1, v.r.nodes[e].next {
		if !f(reply{v.r, e}) {
			return
		}
	}
}

// next is the element after v in its array (whatever v's own elements);
// past the last one it reads the next reply: check the array's len.
func (v reply) next() reply {
	if v.i < 0 {
		return reply{v.r, absent}
	}
	return reply{v.r, v.r.nodes[v.i].next}
}

// first is an array's first element; a nil reply when it has none.
func (v reply) first() reply {
	if v.len() <= 0 {
		return reply{v.r, absent}
	}
	return reply{v.r, v.i + 1}
}

// field returns the value after the string name in a map, or in an array
// of names and values (RESP2's maps); a nil reply when there is none.
func (v reply) field(name string) reply {
	n := v.len()
	if n%2 != 0 {
		return reply{v.r, absent}
	}
	nodes := v.r.nodes
	for i, k := 0, v.i+1; i < n; i += 2 {
		val := nodes[k].next
		if kn := &nodes[k]; kn.kind == kindStr && string(v.r.buf[kn.off:kn.end]) == name {
			return reply{v.r, val}
		}
		k = nodes[val].next
	}
	return reply{v.r, absent}
}

// pairs calls f with each name and value of a map, or of an array of
// names and values.
func (v reply) pairs(f func(k, v reply)) {
	n := v.len()
	if n%2 != 0 {
		return
	}
	nodes := v.r.nodes
	for i, k := 0, v.i+1; i < n; i += 2 {
		val := nodes[k].next
		f(reply{v.r, k}, reply{v.r, val})
		k = nodes[val].next
	}
}

// String renders a reply for error messages.
func (v reply) String() string {
	var b bytes.Buffer
	v.render(&b)
	return b.String()
}

func (v reply) render(b *bytes.Buffer) {
	n := v.node()
	switch n.kind {
	case kindNil:
		b.WriteString("<nil>")
	case kindInt:
		b.WriteString(strconv.FormatInt(n.num(), 10))
	case kindArr:
		b.WriteByte('[')
		sep := ""
		v.elems(func(e reply) bool {
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
func setText[T string | []byte](r *replies, nd *rnode, t T) {
	nd.off = int32(len(r.buf))
	r.buf = append(r.buf, t...)
	nd.end = int32(len(r.buf))
}

// add appends a value go-redis decoded (the client transport) as nodes.
func (r *replies) add(v any, depth int) {
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
