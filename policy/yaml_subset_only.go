//go:build wasip1 || backstop_yamlsubset

package policy

// readYAML is the YAML-subset reader in backstop.wasm (yaml_subset.go): the
// module reads policy files without go.yaml.in/yaml/v3. Build the native
// package with -tags backstop_yamlsubset to run its tests on this path.
func readYAML(data []byte) (*node, *FieldError) { return readSubset(data) }
