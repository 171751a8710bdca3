//go:build !wasip1 && !backstop_yamlsubset

package policy

import (
	"strings"

	"go.yaml.in/yaml/v3"
)

// readYAML parses data with go.yaml.in/yaml/v3: the whole of YAML (anchors,
// aliases, merge keys, tags, block scalars). It returns a nil root when data
// holds no document. backstop.wasm reads a subset instead (yaml_subset.go).
func readYAML(data []byte) (*node, *FieldError) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &FieldError{Field: "(document)", Reason: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, nil
	}
	return fromLib(doc.Content[0], map[*yaml.Node]*node{}), nil
}

// fromLib converts a yaml.Node tree, following aliases to the node their
// anchor marks. seen keeps one node per yaml.Node, so shared nodes stay
// shared and a cycle ends.
func fromLib(n *yaml.Node, seen map[*yaml.Node]*node) *node {
	for i := 0; i < 8 && n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		n = n.Alias
	}
	if c, ok := seen[n]; ok {
		return c
	}
	c := &node{tag: n.ShortTag(), tagged: n.Style&yaml.TaggedStyle != 0, value: n.Value, line: n.Line}
	seen[n] = c
	switch n.Kind {
	case yaml.ScalarNode:
		c.kind = scalarNode
	case yaml.MappingNode:
		c.kind = mappingNode
	case yaml.SequenceNode:
		c.kind = sequenceNode
	}
	for _, e := range n.Content {
		c.content = append(c.content, fromLib(e, seen))
	}
	return c
}
