package policy

// node is one node of a parsed policy file: what the decoder reads, from
// either YAML reader (yaml_lib.go natively, yaml_subset.go in backstop.wasm).
// Aliases are already replaced by the node their anchor marks, so a node
// may appear in several places (merge keys rely on that identity).
type node struct {
	kind    nodeKind
	tag     string // the resolved short tag: "!!str", "!!int", "!!map", "!!merge"...
	tagged  bool   // the file wrote the tag ("!!str 3")
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
