package host_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/backstop-dev/backstop/contract"
	"github.com/backstop-dev/backstop/host"
	"github.com/backstop-dev/backstop/internal/abi"
)

// tinyModule is a hand-assembled module that exports only abi_version,
// returning version: enough to see how a host treats another ABI.
func tinyModule(version byte) []byte {
	name := "abi_version"
	return slices.Concat(
		[]byte{0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00},                                     // magic, version 1
		[]byte{0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f},                                           // type section: () -> i32
		[]byte{0x03, 0x02, 0x01, 0x00},                                                             // function section: func 0 has type 0
		[]byte{0x07, byte(len(name) + 4), 0x01, byte(len(name))}, []byte(name), []byte{0x00, 0x00}, // export func 0
		[]byte{0x0a, 0x06, 0x01, 0x04, 0x00, 0x41, version & 0x3f, 0x0b}, // code: i32.const version; end
	)
}

func TestWrongABIVersionRefused(t *testing.T) {
	ctx := context.Background()
	_, err := host.New(ctx, host.WithModule(tinyModule(2)))
	if err == nil || err.Error() != "backstop.wasm ABI version 2 is not supported by this host (want 1)" {
		t.Errorf("New = %v", err)
	}
	// Version 1 but none of the other exports: refused at start, not at the
	// first Decide.
	_, err = host.New(ctx, host.WithModule(tinyModule(1)))
	if err == nil || !strings.Contains(err.Error(), "is not exported") {
		t.Errorf("New = %v", err)
	}
}

// TestImports pins the module's imports: only the wasi_snapshot_preview1
// functions the Go runtime calls (the module links neither os nor syscall).
// A new import means a new capability for every host to review.
func TestImports(t *testing.T) {
	want := []string{
		"args_get", "args_sizes_get", // runtime: argv, empty
		"clock_time_get",                   // runtime: nanotime/walltime (fake in hosts)
		"environ_get", "environ_sizes_get", // runtime: environment, empty
		"fd_write",    // runtime crash messages, to stderr
		"poll_oneoff", // runtime: idle scheduler
		"proc_exit",   // runtime: fatal errors
		"random_get",  // runtime: hash seeds
		"sched_yield", // runtime: spinning
	}
	wasm, err := os.ReadFile("../contract/backstop.wasm")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter()) // compiles fastest
	defer rt.Close(ctx)
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != "wasi_snapshot_preview1" {
			t.Errorf("import from module %q: %s", mod, name)
		}
		got = append(got, name)
	}
	slices.Sort(got)
	got = slices.Compact(got) // the runtime and syscall both import fd_write
	if !slices.Equal(got, want) {
		t.Errorf("imports changed:\n got %v\nwant %v", got, want)
	}
	if n := len(cm.ImportedMemories()); n != 0 {
		t.Errorf("%d imported memories", n)
	}
}

// The module exports nothing the schema (contract/abi.json, abi.Exports)
// does not list, beside what every reactor has: a new export is documented
// and checked in every host, or the build says so here.
func TestEveryExportIsInTheSchema(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	cm, err := rt.CompileModule(ctx, contract.Module)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{"_initialize": true}
	for _, e := range abi.Exports {
		listed[e.Name] = true
	}
	for name := range cm.ExportedFunctions() {
		if !listed[name] {
			t.Errorf("backstop.wasm exports %s, which contract/abi.json does not list", name)
		}
	}
}
