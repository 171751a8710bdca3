package policy

// node is one node of a parsed policy file: what the decoder reads, from
// the YAML reader (yaml_subset.go, natively and in backstop.wasm). The
// reader refuses anchors and aliases, so each node appears in one place.
type node struct {
	kind    nodeKind
	tag     string // the resolved short tag: "!!str", "!!int", "!!map", "!!merge"...
	tagged  bool   // the file wrote the tag ("!!str 3"): never from readYAML, which refuses tags
	value   string // a scalar's text
	line    int    // 1-based
	content []*node
}

type nodeKind uint8

const (
	scalarNode nodeKind = iota + 1
	mappingNode
	sequenceNode
)
