//go:build !unix

package rego

import "testing"

// reportCPU is a no-op where getrusage is not available.
func reportCPU(*testing.B) {}
