package resp

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

// TestReadRESP reads every kind of RESP2 and RESP3 reply, and refuses
// what is not RESP without a panic.
func TestReadRESP(t *testing.T) {
	in := "+OK\r\n-ERR no\r\n:42\r\n:-7\r\n$5\r\nhello\r\n$-1\r\n*-1\r\n_\r\n#t\r\n,1.5\r\n(12345678901234567890\r\n" +
		"=8\r\ntxt:abcd\r\n%2\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n*2\r\n:2\r\n:3\r\n~1\r\n+x\r\n|1\r\n+key\r\n+val\r\n:9\r\n!3\r\nBAD\r\n"
	var r Replies
	rd := bufio.NewReader(strings.NewReader(in))
	for range 16 {
		r.roots = append(r.roots, int32(len(r.nodes)))
		if err := r.read(rd, 0); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]string, len(r.roots))
	for i := range r.roots {
		v := r.reply(Ref(i))
		if err := v.Err(); err != nil {
			got[i] = "error " + err.Error()
		} else {
			got[i] = v.String()
		}
	}
	want := []string{"OK", "error ERR no", "42", "-7", "hello", "<nil>", "<nil>", "<nil>", "1", "1.5", "12345678901234567890",
		"abcd", "[a 1 b [2 3]]", "[x]", "9", "error BAD"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("replies\n%q\nwant\n%q", got, want)
	}
	if b, _ := r.reply(12).Field("b").Str(); b != "" {
		t.Errorf("field b of a map holding an array: %q", b)
	}
	if n, ok := r.reply(12).Field("a").Int(); !ok || n != 1 {
		t.Errorf("field a: %d %v", n, ok)
	}
	for _, bad := range []string{"?\r\n", "$3\r\nab", ":x\r\n", "*2\r\n:1\r\n", "$-5\r\n", "$3\r\nabcd\r\n", strings.Repeat("*1\r\n", 40) + ":1\r\n", "+no end"} {
		var r Replies
		err := r.read(bufio.NewReader(strings.NewReader(bad)), 0)
		if !errors.Is(err, errBadReply) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			t.Errorf("%q: %v, want a malformed reply or a short read", bad, err)
		}
	}
}
