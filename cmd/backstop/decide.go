package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/vector"
	"github.com/backstop-dev/backstop/policy"
)

// decide answers failures read as JSON lines (the vector `input` shape)
// with decisions written as JSON lines (the `expect` shape), through
// backstop.wasm: any shell or language can ask the policy. Exactly one
// output line per input line, in order, also for a blank, invalid or
// overlong line and for a last line without "\n": a bad line gets
// {"error": "..."} (vector.DecodeCallLine says which) and the stream goes on.
// An answer is flushed before the command waits for more input. A line's
// `duration_ms` (how long the call took) is recorded with record_duration
// before its failure is decided, for a slow-call-rate breaker.
//
// A line without `random` (or with `"random": null`) gets a uniform draw in
// [0, 1) of its own: full and equal jitter scale the delay by it, and the
// 0 the vectors use for an absent random would make every delay of full
// jitter 0, a herd retrying at once. A line with `random` is answered from
// it alone, so an answer is reproducible when the caller passes it;
// --random X gives every line without one the value X instead of a draw
// (the cross-host check runs the three commands with --random 0 to compare
// their bytes on lines that leave random out).
func decide(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("decide")
	pol := fs.String("policy", "default", "policy file (JSON or YAML) or preset name")
	randomFlag := fs.String("random", "draw", "the random of a line that sets none: draw (a uniform draw in [0, 1) per line) or a number in [0, 1)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	absentRandom := rand.Float64
	if *randomFlag != "draw" {
		r, err := strconv.ParseFloat(*randomFlag, 64)
		if err != nil || !(r >= 0 && r < 1) {
			return fmt.Errorf("%w: --random must be draw or a number in [0, 1), got %q", errUsage, *randomFlag)
		}
		absentRandom = func() float64 { return r }
	}
	src, name, err := readPolicy(*pol)
	if err != nil {
		return err
	}
	rt, err := newRuntime(ctx, host.WithPoolSize(1))
	if err != nil {
		return err
	}
	defer rt.Close(ctx)
	p, err := rt.Load(ctx, src)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer p.Close(ctx)
	// The lints, as `policy check` prints them (and every host's decide
	// command: the cross-host check compares them).
	for _, l := range p.Lints() {
		fmt.Fprintf(stderr, "warning: %s\n", l)
	}

	in := bufio.NewReaderSize(stdin, 64<<10)
	out := bufio.NewWriterSize(stdout, 64<<10)
	var buf []byte
	for {
		line, tooLong, readErr := readLine(in, buf[:0])
		buf = line
		if readErr != nil && readErr != io.EOF {
			return readErr
		}
		if readErr == io.EOF && line == nil && !tooLong {
			return out.Flush()
		}
		var d policy.Decision
		input, dur, err := vector.DecodeCallLine(line)
		if tooLong {
			err, dur = vector.ErrLineTooLong, vector.Duration{}
		}
		// The call's duration first, as a loop reports it before deciding.
		if dur.Record {
			if rerr := p.RecordDuration(ctx, dur.NowMs, dur.Ms); rerr != nil {
				err = rerr
			}
		}
		if err == nil {
			f := input.Failure()
			if f.Random == 0 && !hasRandom(line) {
				f.Random = absentRandom()
			}
			d, err = p.Decide(ctx, f)
		}
		if _, err := out.Write(vector.Answer(d, err)); err != nil {
			return err
		}
		// Flush unless another whole line is already buffered: a process
		// that writes one line and waits gets its answer, and a burst of
		// lines is answered in one write.
		if next, _ := in.Peek(in.Buffered()); bytes.IndexByte(next, '\n') < 0 || readErr != nil {
			if err := out.Flush(); err != nil {
				return err
			}
		}
		if readErr == io.EOF {
			return nil
		}
	}
}

// hasRandom reports whether a line vector.DecodeLine accepted sets
// `random` (null is not setting it). DecodeLine reads an absent random as
// 0, so only a line whose random came back 0 needs this second look.
func hasRandom(line []byte) bool {
	var fields map[string]json.RawMessage
	if json.Unmarshal(line, &fields) != nil {
		return false
	}
	v, ok := fields["random"]
	return ok && string(v) != "null"
}

// readLine reads the next line into buf and returns it without its "\n".
// A line longer than vector.MaxLineBytes is read to its end but not kept:
// tooLong is set and line is nil. At the end of the input, err is io.EOF,
// with the last line when it had no "\n" (line is nil when nothing was
// left).
func readLine(r *bufio.Reader, buf []byte) (line []byte, tooLong bool, err error) {
	n := 0
	for {
		frag, err := r.ReadSlice('\n')
		content := frag
		if err == nil {
			content = frag[:len(frag)-1]
		}
		if n += len(content); n > vector.MaxLineBytes {
			tooLong, buf = true, nil
		} else if !tooLong {
			buf = append(buf, content...)
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == nil:
			if buf == nil && !tooLong {
				buf = []byte{} // an empty line, not the end
			}
			return buf, tooLong, nil
		case n == 0 && err == io.EOF:
			return nil, false, io.EOF
		case buf == nil && !tooLong:
			buf = []byte{}
		}
		return buf, tooLong, err
	}
}

// newRuntime is the wasm host the commands decide through (decide, the
// demo). Its compiled code is kept in the user's cache directory,
// os.UserCacheDir()/backstop/wazero ($XDG_CACHE_HOME or ~/.cache on
// Linux), so only the first run of a build compiles the module (about a
// second); the others load it. Without a usable cache directory it
// compiles each time.
func newRuntime(ctx context.Context, opts ...host.Option) (*host.Runtime, error) {
	if dir, err := os.UserCacheDir(); err == nil {
		withCache := append(opts[:len(opts):len(opts)], host.WithCompilationCache(filepath.Join(dir, "backstop", "wazero")))
		if rt, err := host.New(ctx, withCache...); err == nil {
			return rt, nil
		}
	}
	return host.New(ctx, opts...)
}
