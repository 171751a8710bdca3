package main

import (
	"bytes"
	"os"
	"testing"
)

// The committed testdata/vectors/inputs.json is what `make vectors` writes.
func TestInputsFileIsUpToDate(t *testing.T) {
	in := inputs()
	want, err := in.Format()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../../testdata/vectors/inputs.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("testdata/vectors/inputs.json is stale: run `make vectors`")
	}
}
