package bundle

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// maxYAMLDepth bounds the nesting of YAML values converted to JSON; it is the
// same bound canonical JSON has (kernel/canon.MaxDepth).
const maxYAMLDepth = 256

// JSONFromYAML converts the YAML value n to JSON text. It is how values
// written in YAML bundle files (test-case args, rule operands) become the JSON
// an engine sees:
//
//   - mappings become objects; keys must be scalars and are taken as strings
//     ("1: x" has the key "1"); a duplicate key is an error;
//   - sequences become arrays;
//   - strings, and timestamps such as 2026-01-02T15:04:05Z, become strings;
//   - null, true and false become themselves;
//   - numbers keep their literal when it is already a JSON number ("1.50"
//     stays 1.50); other YAML number forms (0x1f, 0o17, 1_000, +1, .5) are
//     converted to their decimal value; .inf and .nan are errors;
//   - aliases, merge keys (<<), !!binary and custom tags are errors, and so
//     is nesting deeper than 256.
//
// Errors are *[Error] values carrying the line of the offending node; File
// is left for the caller to fill in.
func JSONFromYAML(n *yaml.Node) (json.RawMessage, error) {
	b, err := appendYAMLValue(nil, n, 0)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func yamlValueError(n *yaml.Node, format string, args ...any) error {
	return &Error{Line: n.Line, Err: fmt.Errorf(format, args...)}
}

func appendYAMLValue(b []byte, n *yaml.Node, depth int) ([]byte, error) {
	if n == nil || n.Kind == 0 {
		return append(b, "null"...), nil // an empty document
	}
	if depth > maxYAMLDepth {
		return nil, yamlValueError(n, "nesting deeper than %d", maxYAMLDepth)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return append(b, "null"...), nil
		}
		return appendYAMLValue(b, n.Content[0], depth)
	case yaml.AliasNode:
		return nil, yamlValueError(n, "YAML aliases (*%s) are not supported", n.Value)
	case yaml.SequenceNode:
		b = append(b, '[')
		for i, c := range n.Content {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendYAMLValue(b, c, depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case yaml.MappingNode:
		b = append(b, '{')
		seen := make(map[string]int, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return nil, yamlValueError(k, "mapping keys must be scalars")
			}
			if k.ShortTag() == "!!merge" {
				return nil, yamlValueError(k, "YAML merge keys (<<) are not supported")
			}
			if line, dup := seen[k.Value]; dup {
				return nil, yamlValueError(k, "mapping key %q already defined at line %d", k.Value, line)
			}
			seen[k.Value] = k.Line
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k.Value)
			b = append(b, ':')
			var err error
			if b, err = appendYAMLValue(b, v, depth+1); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case yaml.ScalarNode:
		return appendYAMLScalar(b, n)
	}
	return nil, yamlValueError(n, "unsupported YAML node")
}

func appendYAMLScalar(b []byte, n *yaml.Node) ([]byte, error) {
	switch tag := n.ShortTag(); tag {
	case "!!str", "!!timestamp":
		return appendJSONString(b, n.Value), nil
	case "!!null":
		return append(b, "null"...), nil
	case "!!bool":
		var v bool
		if err := n.Decode(&v); err != nil {
			return nil, yamlValueError(n, "%s", yamlReason(err))
		}
		return strconv.AppendBool(b, v), nil
	case "!!int":
		if isJSONNumber(n.Value) {
			return append(b, n.Value...), nil
		}
		var i int64
		if err := n.Decode(&i); err == nil {
			return strconv.AppendInt(b, i, 10), nil
		}
		var u uint64
		if err := n.Decode(&u); err != nil {
			return nil, yamlValueError(n, "integer %q out of range", n.Value)
		}
		return strconv.AppendUint(b, u, 10), nil
	case "!!float":
		if isJSONNumber(n.Value) {
			return append(b, n.Value...), nil
		}
		var f float64
		if err := n.Decode(&f); err != nil {
			return nil, yamlValueError(n, "%s", yamlReason(err))
		}
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, yamlValueError(n, "%s has no JSON form", n.Value)
		}
		return strconv.AppendFloat(b, f, 'g', -1, 64), nil
	default:
		return nil, yamlValueError(n, "unsupported YAML tag %s", tag)
	}
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// isJSONNumber reports whether s is a number literal of the JSON grammar.
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == start {
			return false
		}
	}
	return i == len(s)
}

// yamlReason turns a yaml.v3 error into a short reason: the "yaml: " prefix
// and the "unmarshal errors:" header are dropped, Go type names are removed,
// and several errors are joined with "; ".
func yamlReason(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		s := ""
		for i, e := range te.Errors {
			if i > 0 {
				s += "; "
			}
			s += stripGoType(e)
		}
		return s
	}
	s := err.Error()
	if len(s) > 6 && s[:6] == "yaml: " {
		s = s[6:]
	}
	return s
}

// stripGoType rewrites yaml.v3's "field x not found in type pkg.T", which
// names an internal Go type, as `unknown field "x"`.
func stripGoType(s string) string {
	const pre, mid = "field ", " not found in type "
	i := strings.Index(s, pre)
	j := strings.Index(s, mid)
	if i < 0 || j < i+len(pre) {
		return s
	}
	k := j + len(mid)
	for k < len(s) && s[k] != ' ' && s[k] != ';' {
		k++
	}
	return s[:i] + fmt.Sprintf("unknown field %q", s[i+len(pre):j]) + s[k:]
}

// SplitYAMLLine splits yaml.v3's "line N: reason" into N and reason; it
// returns 0 and s unchanged when s has no such prefix. The rules engine uses
// it too, so load errors of both read the same.
func SplitYAMLLine(s string) (int, string) {
	rest, ok := strings.CutPrefix(s, "line ")
	if !ok {
		return 0, s
	}
	num, reason, ok := strings.Cut(rest, ": ")
	if !ok {
		return 0, s
	}
	n, err := strconv.Atoi(num)
	if err != nil || n <= 0 {
		return 0, s
	}
	return n, reason
}
