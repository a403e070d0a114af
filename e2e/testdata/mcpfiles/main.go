// Command mcpfiles is an upstream MCP server of the gate's end-to-end
// tests, built with the MCP Go SDK and served over stdio: read (annotated
// read-only), write and delete (annotated destructive). Every call appends
// a line to --journal, so a test counts what reached the upstream across
// proxy restarts.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type pathIn struct {
	Path string `json:"path"`
}

type writeIn struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

func main() {
	journal := flag.String("journal", "", "file every call appends to")
	flag.Parse()
	note := func(format string, args ...any) {
		f, err := os.OpenFile(*journal, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(f, format+"\n", args...)
		_ = f.Sync()
		f.Close()
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "files", Version: "1"}, nil)
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	mcp.AddTool(s, &mcp.Tool{Name: "read", Description: "read a file", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, any, error) {
			note("read %s", in.Path)
			return text("content of " + in.Path), nil, nil
		})
	no := false
	mcp.AddTool(s, &mcp.Tool{Name: "write", Description: "write a file", Annotations: &mcp.ToolAnnotations{DestructiveHint: &no, OpenWorldHint: &no}},
		func(_ context.Context, _ *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, any, error) {
			note("write %s", in.Path)
			return text(fmt.Sprintf("wrote %d bytes to %s", len(in.Content), in.Path)), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "delete", Description: "delete a file", Annotations: &mcp.ToolAnnotations{}},
		func(_ context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, any, error) {
			note("delete %s", in.Path)
			return text("deleted " + in.Path), nil, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		log.Fatal(err)
	}
}
