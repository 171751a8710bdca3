package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"

	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/vector"
)

// decide answers failures read as JSON lines (the vector `input` shape)
// with decisions written as JSON lines (the `expect` shape), through
// backstop.wasm: any shell or language can ask the policy. One output line
// per input line, in order; a bad line gets {"error": "..."} and the stream
// goes on.
func decide(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("decide", flag.ContinueOnError)
	pol := fs.String("policy", "default", "policy file (JSON or YAML) or preset name")
	if err := fs.Parse(args); err != nil || fs.NArg() != 0 {
		return errUsage
	}
	src, name, err := readPolicy(*pol)
	if err != nil {
		return err
	}
	rt, err := host.New(ctx, host.WithPoolSize(1))
	if err != nil {
		return err
	}
	defer rt.Close(ctx)
	p, err := rt.Load(ctx, src)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer p.Close(ctx)

	in := bufio.NewReaderSize(stdin, 64<<10)
	out := bufio.NewWriterSize(stdout, 64<<10)
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for {
		line, readErr := in.ReadBytes('\n')
		if line = bytes.TrimSpace(line); len(line) > 0 {
			var answer any
			if input, err := vector.DecodeInput(line); err != nil {
				answer = errorLine{"invalid input line: " + err.Error()}
			} else if d, err := p.Decide(ctx, input.Failure()); err != nil {
				answer = errorLine{vector.FromDecision(d, err).Error}
			} else {
				answer = vector.FromDecision(d, nil)
			}
			if err := enc.Encode(answer); err != nil {
				return err
			}
		}
		// Flush whenever the reader would block, so a process that writes
		// one line and waits for the answer gets it.
		if in.Buffered() == 0 || readErr != nil {
			if err := out.Flush(); err != nil {
				return err
			}
		}
		if readErr == io.EOF {
			return nil
		}
		if readErr != nil {
			return readErr
		}
	}
}

type errorLine struct {
	Error string `json:"error"`
}
