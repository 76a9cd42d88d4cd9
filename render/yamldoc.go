package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// maxDepth bounds how deeply nested a decoded value may be. yaml.v3 already
// refuses more than 10000 levels while parsing; aliases can stack parsed
// depth on top of parsed depth, so the converter checks again.
const maxDepth = 10000

// errTooComplex is returned when a document expands to more nodes than its
// size justifies, which is what alias bombs ("billion laughs") do.
var errTooComplex = errors.New("document expands to too many nodes (alias bomb?)")

// document is one YAML document of a multi-document stream.
type document struct {
	// Index is the 1-based position of the document in its file, counting
	// empty documents too so that it matches what an editor shows.
	Index int
	// Line is the 1-based line the document's content starts on.
	Line int
	// Value is the JSON-compatible value of the document: maps are
	// map[string]interface{}, numbers int64 or float64. It is nil for an
	// empty document.
	Value interface{}
}

// object returns the document as a JSON object, or nil if it is not one.
func (d document) object() map[string]interface{} {
	m, _ := d.Value.(map[string]interface{})
	return m
}

// nodeBudget is how many nodes a stream of n bytes may expand to. Without
// aliases a document never has more nodes than bytes; the factor leaves room
// for the ordinary use of anchors and merge keys.
func nodeBudget(n int) int {
	return 8*n + 1024
}

// decodeDocuments parses a YAML stream into JSON-compatible values. Aliases
// are expanded within a node budget proportional to the input size, so an
// alias bomb is an error rather than an allocation of gigabytes. Decoding
// stops at the first syntax error; the documents before it are returned with
// the error, whose text carries the line number in the whole stream.
func decodeDocuments(data []byte) ([]document, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	c := &converter{budget: nodeBudget(len(data))}
	var docs []document
	for index := 1; ; index++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return docs, fmt.Errorf("document %d: %w", index, substitutionHint(data, err))
		}
		v, err := c.value(&n, 0)
		if err != nil {
			return docs, fmt.Errorf("document %d: %w", index, err)
		}
		docs = append(docs, document{Index: index, Line: contentLine(&n), Value: v})
	}
}

// contentLine is the line of a document's first content node.
func contentLine(n *yaml.Node) int {
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		return n.Content[0].Line
	}
	return n.Line
}

// converter turns yaml.v3 nodes into JSON-compatible values, spending one
// unit of budget per node visited (aliases included).
type converter struct {
	budget int
}

func (c *converter) value(n *yaml.Node, depth int) (interface{}, error) {
	c.budget--
	if c.budget < 0 {
		return nil, errTooComplex
	}
	if depth > maxDepth {
		return nil, fmt.Errorf("line %d: nesting deeper than %d levels", n.Line, maxDepth)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return c.value(n.Content[0], depth+1)
	case yaml.AliasNode:
		if n.Alias == nil {
			return nil, fmt.Errorf("line %d: unknown alias", n.Line)
		}
		return c.value(n.Alias, depth+1)
	case yaml.ScalarNode:
		return scalar(n)
	case yaml.SequenceNode:
		out := make([]interface{}, 0, len(n.Content))
		for _, item := range n.Content {
			v, err := c.value(item, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		return c.mapping(n, depth)
	}
	return nil, fmt.Errorf("line %d: unsupported YAML node kind %d", n.Line, n.Kind)
}

// mapping converts a mapping node. Explicit keys win over merged ("<<")
// ones, and earlier merge sources win over later ones, as the YAML merge key
// specification says.
func (c *converter) mapping(n *yaml.Node, depth int) (map[string]interface{}, error) {
	out := make(map[string]interface{}, len(n.Content)/2)
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		key, err := c.key(k, depth)
		if err != nil {
			return nil, err
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("line %d: mapping key %q already defined", k.Line, key)
		}
		val, err := c.value(v, depth+1)
		if err != nil {
			return nil, err
		}
		out[key] = val
	}
	for _, m := range merges {
		sources := []*yaml.Node{m}
		if resolve(m).Kind == yaml.SequenceNode {
			sources = resolve(m).Content
		}
		for _, src := range sources {
			v, err := c.value(src, depth+1)
			if err != nil {
				return nil, err
			}
			sm, ok := v.(map[string]interface{})
			if !ok {
				return nil, fmt.Errorf("line %d: merge key value is not a mapping", src.Line)
			}
			for k, v := range sm {
				if _, set := out[k]; !set {
					out[k] = v
				}
			}
		}
	}
	return out, nil
}

// key returns a mapping key as a string, the way JSON needs it.
func (c *converter) key(k *yaml.Node, depth int) (string, error) {
	r := resolve(k)
	if r.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("line %d: mapping key is not a scalar", k.Line)
	}
	c.budget--
	if c.budget < 0 {
		return "", errTooComplex
	}
	return r.Value, nil
}

// resolve follows aliases.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < maxDepth; i++ {
		n = n.Alias
	}
	return n
}

// scalar converts a scalar by its resolved tag. Anything that is not null,
// bool, int or float stays the literal string, including timestamps and
// binary, which Kubernetes carries as strings.
func scalar(n *yaml.Node) (interface{}, error) {
	switch n.ShortTag() {
	case "!!null":
		return nil, nil
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		return b, nil
	case "!!int":
		var i int64
		if err := n.Decode(&i); err == nil {
			return i, nil
		}
		fallthrough // too large for int64
	case "!!float":
		var f float64
		if err := n.Decode(&f); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, fmt.Errorf("line %d: %s cannot be represented in JSON", n.Line, strings.TrimSpace(n.Value))
		}
		return f, nil
	}
	return n.Value, nil
}
