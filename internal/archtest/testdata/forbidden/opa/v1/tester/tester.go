// Package tester stands in for OPA's test runner, which imports testing
// (for its benchmark helpers).
package tester

import _ "testing"
