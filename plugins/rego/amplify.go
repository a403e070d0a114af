package rego

import (
	"errors"
	"fmt"
	"math/big"
	"net"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"

	"github.com/open-policy-agent/opa/v1/ast"
)

// maxHostOutput bounds what one host builtin call may build. A wasm
// module's memory is capped, but a host builtin runs in the kernel's Go
// heap before its result is copied in: the few builtins whose output can be
// far larger than their arguments are checked before they run, so that a
// small call cannot make the kernel allocate gigabytes (numbers.range_step(0,
// 1e12, 1), net.cidr_expand("::/64"), sprintf("%999999999d", [1]), ...).
const maxHostOutput = 16 << 20

// amplifiers estimate, from the arguments, an upper bound of the output of
// the builtins that amplify; anything else builds at most a small multiple
// of its arguments, which are already inside the capped module memory.
var amplifiers = map[string]func(args []*ast.Term) (float64, error){
	"numbers.range_step": func(args []*ast.Term) (float64, error) {
		a, b, step := number(args[0]), number(args[1]), number(args[2])
		if step == 0 {
			return 0, nil // refused by the builtin itself
		}
		n := (b - a) / step
		if n < 0 {
			n = -n
		}
		return (n + 1) * 16, nil
	},
	"net.cidr_expand": func(args []*ast.Term) (float64, error) {
		s, ok := args[0].Value.(ast.String)
		if !ok {
			return 0, nil
		}
		_, ipNet, err := net.ParseCIDR(string(s))
		if err != nil {
			return 0, nil // refused by the builtin itself
		}
		ones, bits := ipNet.Mask.Size()
		return pow2(bits-ones) * float64(len(s)+8), nil
	},
	"sprintf": func(args []*ast.Term) (float64, error) {
		f, ok := args[0].Value.(ast.String)
		if !ok {
			return 0, nil
		}
		// Each verb prints at most its longest argument, padded to its
		// width and precision. Go's fmt ignores a width or precision over
		// fmtMaxWidth (%!(NOVERB), %!(BADWIDTH), %!(BADPREC)), so none
		// counts for more; a numeric argument is a width only when the
		// format takes one from the arguments (%*d, %.*f).
		largest, starWidth := 0.0, 0.0
		if arr, ok := args[1].Value.(*ast.Array); ok {
			for i := range arr.Len() {
				largest = max(largest, float64(len(arr.Elem(i).String())))
				starWidth = max(starWidth, min(number(arr.Elem(i)), fmtMaxWidth))
			}
		}
		verbs := float64(strings.Count(string(f), "%"))
		stars := float64(strings.Count(string(f), "*"))
		widths := 0.0
		for _, m := range fmtNumbers.FindAllStringSubmatch(string(f), -1) {
			for _, g := range m[1:] {
				if v, err := strconv.ParseFloat(g, 64); err == nil {
					widths += min(v, fmtMaxWidth)
				}
			}
		}
		return float64(len(f)) + widths + stars*starWidth + verbs*largest, nil
	},
	"regex.replace": func(args []*ast.Term) (float64, error) {
		s, ok1 := args[0].Value.(ast.String)
		repl, ok2 := args[2].Value.(ast.String)
		if !ok1 || !ok2 {
			return 0, nil
		}
		// At most n+1 matches, each replaced by repl with its references
		// expanded. A reference expands to a group of its own match, and
		// matches do not overlap, so all the expansions of one reference
		// together take at most n bytes.
		refs := float64(strings.Count(string(repl), "$"))
		n := float64(len(s))
		return n + (n+1)*float64(len(repl)) + refs*n, nil
	},
	"strings.render_template": func(args []*ast.Term) (float64, error) {
		tmpl, ok := args[0].Value.(ast.String)
		if !ok {
			return 0, nil
		}
		trees, err := parse.Parse("t", string(tmpl), "", "", map[string]any{})
		if err != nil {
			return 0, nil // refused by the builtin itself
		}
		depth := 0
		for _, t := range trees {
			d, calls := rangeDepth(t.Root)
			if calls {
				return 0, fmt.Errorf("strings.render_template: a template that calls templates has no size bound in the sandbox")
			}
			depth = max(depth, d)
		}
		elems := 1.0
		ast.WalkTerms(args[1], func(t *ast.Term) bool {
			switch x := t.Value.(type) {
			case *ast.Array:
				elems += float64(x.Len())
			case ast.Object:
				elems += float64(x.Len())
			case ast.Set:
				elems += float64(x.Len())
			case ast.String:
				elems += float64(len(x)) / 64
			}
			return false
		})
		size := float64(len(tmpl)) + float64(len(args[1].String()))
		for range depth {
			size *= elems
		}
		if size <= maxHostOutput {
			return size, nil
		}
		// A range over a part of the element of its enclosing range
		// ({{range .}}, {{range .cells}}) adds its elements to the loops'
		// count; any other multiplies it.
		products := 0
		for _, t := range trees {
			products = max(products, rangeProducts(t.Root, false))
		}
		iterations := 1.0
		for range products {
			iterations *= collections(args[1])
		}
		if iterations > maxTemplateIterations {
			return size, nil
		}
		// The estimate multiplies every range by all the data; nested
		// ranges over moderate data (a table) render far less. With few
		// enough iterations, render it into a writer that stops at the
		// budget: the answer is then exact.
		return renderedSize(string(tmpl), args[1]), nil
	},
	"graph.reachable_paths": func(args []*ast.Term) (float64, error) {
		// Every path is output, and their number can grow exponentially
		// with the edges: walk them as the builtin does, counting the
		// bytes of the paths it would commit, and stop past the budget.
		g, ok := args[0].Value.(ast.Object)
		if !ok {
			return 0, nil
		}
		var starts []*ast.Term
		switch x := args[1].Value.(type) {
		case *ast.Array:
			x.Foreach(func(t *ast.Term) { starts = append(starts, t) })
		case ast.Set:
			starts = x.Slice()
		}
		w := pathWalk{g: g, onPath: map[string]bool{}}
		for _, s := range starts {
			if g.Get(s) != nil {
				w.walk(s)
			}
		}
		return w.bytes, nil
	},
}

// pathWalk bounds graph.reachable_paths: it follows every simple path from
// a node, committing one where OPA's builtin commits one (at a node with no
// edges, at a node outside the graph, and before an edge back into the
// path), and adds up the bytes of the committed paths until they pass
// maxHostOutput, so that the walk itself costs no more than the budget.
type pathWalk struct {
	g      ast.Object
	onPath map[string]bool
	bytes  float64 // of the paths committed so far
	path   float64 // bytes of the current path
}

// pathElemBytes is what one path element costs besides its text.
const pathElemBytes = 16

func (w *pathWalk) walk(node *ast.Term) {
	if w.bytes > maxHostOutput {
		return
	}
	edges := w.g.Get(node)
	if edges == nil { // outside the graph: the path ends before it
		w.bytes += w.path
		return
	}
	k := node.String()
	size := float64(len(k) + pathElemBytes)
	w.path += size
	defer func() { w.path -= size }()
	if w.path > maxHostOutput { // this path alone is over the budget
		w.bytes += w.path
		return
	}
	var next []*ast.Term
	switch x := edges.Value.(type) {
	case *ast.Array:
		x.Foreach(func(t *ast.Term) { next = append(next, t) })
	case ast.Set:
		next = x.Slice()
	}
	if len(next) == 0 {
		w.bytes += w.path
		return
	}
	w.onPath[k] = true
	defer delete(w.onPath, k)
	for _, n := range next {
		if w.bytes > maxHostOutput {
			return
		}
		if w.onPath[n.String()] {
			w.bytes += w.path
			continue
		}
		w.walk(n)
	}
}

// rangeProducts returns how many nested ranges multiply the number of loop
// iterations: every range, except one nested in a range that iterates
// over a part of its dot.
func rangeProducts(n parse.Node, inRange bool) int {
	most := 0
	visit := func(list *parse.ListNode, inRange bool) {
		if list == nil {
			return
		}
		for _, c := range list.Nodes {
			most = max(most, rangeProducts(c, inRange))
		}
	}
	switch x := n.(type) {
	case *parse.ListNode:
		visit(x, inRange)
	case *parse.RangeNode:
		visit(x.List, true)
		visit(x.ElseList, inRange)
		if inRange && dotRelative(x.Pipe) {
			return most
		}
		return most + 1
	case *parse.IfNode:
		visit(x.List, inRange)
		visit(x.ElseList, inRange)
	case *parse.WithNode:
		// with changes dot: what follows is no longer a part of it.
		visit(x.List, false)
		visit(x.ElseList, inRange)
	}
	return most
}

// dotRelative reports whether a pipeline is dot or a field chain of it,
// without variables or functions.
func dotRelative(p *parse.PipeNode) bool {
	if p == nil || len(p.Decl) > 0 || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 1 {
		return false
	}
	switch p.Cmds[0].Args[0].(type) {
	case *parse.DotNode, *parse.FieldNode:
		return true
	}
	return false
}

// collections counts the elements of every array, object and set in t.
func collections(t *ast.Term) float64 {
	n := 1.0
	ast.WalkTerms(t, func(t *ast.Term) bool {
		switch x := t.Value.(type) {
		case *ast.Array:
			n += float64(x.Len())
		case ast.Object:
			n += float64(x.Len())
		case ast.Set:
			n += float64(x.Len())
		}
		return false
	})
	return n
}

// maxTemplateIterations bounds the loop iterations of a template rendered
// to measure it (about a tenth of a second).
const maxTemplateIterations = 1e6

// renderedSize renders tmpl on vars as strings.render_template does, into
// a writer that stops once past maxHostOutput, and returns how many bytes
// it wrote (0 when the template does not render: the builtin itself then
// fails).
func renderedSize(tmpl string, vars *ast.Term) float64 {
	var data map[string]any
	if err := ast.As(vars.Value, &data); err != nil {
		return 0
	}
	t, err := template.New("template").Parse(tmpl)
	if err != nil {
		return 0
	}
	w := &boundedWriter{limit: maxHostOutput}
	if err := t.Execute(w, data); err != nil && !errors.Is(err, errOverBudget) {
		return 0
	}
	return float64(w.n)
}

var errOverBudget = errors.New("over the budget")

// boundedWriter counts bytes and fails once they pass limit.
type boundedWriter struct{ n, limit int }

func (w *boundedWriter) Write(p []byte) (int, error) {
	w.n += len(p)
	if w.n > w.limit {
		return 0, errOverBudget
	}
	return len(p), nil
}

// fmtMaxWidth is the largest width or precision Go's fmt honours.
const fmtMaxWidth = 1e6

// fmtNumbers finds the widths and precisions of fmt verbs ("%12.3f").
var fmtNumbers = regexp.MustCompile(`%[-+# 0]*(?:\[[0-9]+\])?([0-9]*)(?:\.([0-9]+))?`)

// checkAmplification refuses a call whose output could exceed
// maxHostOutput.
func checkAmplification(name string, args []*ast.Term) error {
	f, ok := amplifiers[name]
	if !ok {
		return nil
	}
	size, err := f(args)
	if err != nil {
		return err
	}
	if size > maxHostOutput {
		return fmt.Errorf("%s: the result could take %.3g bytes, over the sandbox's %d MiB for one builtin call", name, size, maxHostOutput>>20)
	}
	return nil
}

// rangeDepth returns how deeply range actions nest in a template, and
// whether it invokes templates (whose depth is unbounded).
func rangeDepth(n parse.Node) (int, bool) {
	depth, calls := 0, false
	visit := func(list *parse.ListNode) {
		if list == nil {
			return
		}
		for _, c := range list.Nodes {
			d, call := rangeDepth(c)
			depth, calls = max(depth, d), calls || call
		}
	}
	switch x := n.(type) {
	case *parse.ListNode:
		visit(x)
	case *parse.RangeNode:
		visit(x.List)
		visit(x.ElseList)
		return depth + 1, calls
	case *parse.IfNode:
		visit(x.List)
		visit(x.ElseList)
	case *parse.WithNode:
		visit(x.List)
		visit(x.ElseList)
	case *parse.TemplateNode:
		return 0, true
	}
	return depth, calls
}

// number reads a numeric term as a float (0 when it is not a number).
func number(t *ast.Term) float64 {
	n, ok := t.Value.(ast.Number)
	if !ok {
		return 0
	}
	f, ok := new(big.Float).SetString(string(n))
	if !ok {
		return 0
	}
	v, _ := f.Float64()
	return v
}

func pow2(n int) float64 {
	v := 1.0
	for range n {
		v *= 2
	}
	return v
}
