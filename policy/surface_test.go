package policy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// policy exports what a Go user needs to decide, not what only the ABI
// (internal/abi: the packed word and its bound) or the parsers
// (the hint parsers, their bound, the gRPC names in internal/grpccode)
// need.
func TestSurfaceLeavesOutTheABIAndParsers(t *testing.T) {
	notPublic := map[string]bool{
		"Pack": true, "Unpack": true, "MaxDelayMs": true,
		"ParseRetryAfter": true, "ParsePushback": true, "MaxHintMs": true, "GRPCCodeNames": true,
	}
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			var names []*ast.Ident
			switch d := d.(type) {
			case *ast.FuncDecl:
				names = append(names, d.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						names = append(names, s.Names...)
					case *ast.TypeSpec:
						names = append(names, s.Name)
					}
				}
			}
			for _, n := range names {
				if n.IsExported() && notPublic[n.Name] {
					t.Errorf("%s: policy exports %s", fset.Position(n.Pos()), n.Name)
				}
			}
		}
	}
}
